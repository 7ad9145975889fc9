"""The replica's internal HTTP API (the API port, 9000), as an aiohttp app factory.

The app runs where user code runs: its handlers call the handler, its ``@multiplexed`` loader
and ``@batch`` queues directly, in the request's own task. In a replica process that is the
user loop (:mod:`modelplex_replica.usercode`); health, readiness and metrics are also answered
on the control port by the server loop (:mod:`modelplex_replica.control`), so a handler that
computes for a while never makes the replica look dead to its kubelet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from modelplex.cache import ModelCache
from modelplex.calls import CALL_CONTENT_TYPE, Invocation, check_handler, invocation
from modelplex.context import set_multiplexed_model_id
from modelplex.handles import close_handles
from modelplex.http import error_middleware, from_json, is_json, model_id_of, read_body, status_of, to_json, write_chunk
from modelplex.multiplex import find_cache
from modelplex.runtime import Runtime, current_runtime
from modelplex.serve.hosted import background_tasks, reconfigure
from modelplex.wire.credentials import TokenFile
from modelplex.wire.errors import (BadRequest, HandlerError, ModelplexError, NotFound, NotReady, Overloaded,
                                   RequestTimeout)
from modelplex.wire.ids import checked_model_id, validate_model_id
from modelplex.wire.loaded import LOADED_MODELS_PATH, LoadedModels, LoadedSummary
from modelplex.wire.names import LOADED_MODELS_HEADER
from modelplex.wire.pins import PINS_PATH, PinRequest
from modelplex.wire.spec import Deployment, SpecError
from modelplex.wire.user_config import CONFIG_KEY, HASH_KEY, RECONFIGURED_KEY, USER_CONFIG_PATH, config_hash
from modelplex_replica import oip
from modelplex_replica.asgi import HttpIngress, ingress_for
from modelplex_replica.auth import internal_only
from modelplex_replica.health import Health, health_check_of, run_checks
from modelplex_replica.intake import Routed, routed_of
from modelplex_replica.metrics import ReplicaMetrics
from modelplex_replica.pins import pin
from modelplex_replica.preload import preload_hot_models
from modelplex_replica.ray_http import STARLETTE, send_response, starlette_request
from modelplex_replica.reporter import AnnotationReporter, Patch
from modelplex_replica.streams import STREAM_FAILED, cut_stream
from modelplex_replica.usercode import TakingTurns

log = logging.getLogger("modelplex.replica")



@dataclass(frozen=True)
class Published:
    """The cache's state as the answers and the reporter read it, encoded once per change."""

    document: LoadedModels
    body: bytes  # GET /v1/models
    summary: LoadedSummary
    header: str  # the summary as the X-Modelplex-Loaded-Models header and the pod annotation

    @classmethod
    def of(cls, document: LoadedModels) -> Published:
        summary = document.summary()
        return cls(document, to_json(document.to_dict()), summary, summary.to_json())


@dataclass
class ReplicaState:
    """Everything a request handler needs, kept on the app under :data:`STATE`.

    The app's loop (the user loop) changes all of it; the control port's server loop only
    reads ``ready``, ``draining``, ``active`` and the metrics.
    """

    deployment: Deployment
    handler: Any
    cache: ModelCache | None
    metrics: ReplicaMetrics
    inflight: int = 0
    #: Requests on their way through the replica (in a slot, or waiting for their model's load).
    active: int = 0
    ready: bool = False
    #: SIGTERM: not ready, no new work, what runs finishes.
    draining: bool = False
    reporter: AnnotationReporter | None = None
    prewarm_errors: dict[str, str] = field(default_factory=dict)
    #: A serve.ingress app or a route prefix (None: every path reaches ``__call__``).
    ingress: HttpIngress | None = None
    #: What the cache holds, replaced whole on every cache change (encoded once for every
    #: answer's header, ``GET /v1/models`` and the annotation).
    published: Published = Published.of(LoadedModels())
    #: The namespace's internal credential (None: open, a replica on loopback started by hand).
    internal: TokenFile | None = None
    #: The handler's own check_health results (:mod:`modelplex_replica.health`).
    health: Health = field(default_factory=Health)
    #: The hash of the ``userConfig`` the handler last applied (None: none given), and the lock
    #: that lets one ``reconfigure`` run at a time (:mod:`modelplex.wire.user_config`).
    user_config: str | None = None
    reconfiguring: asyncio.Lock = field(default_factory=asyncio.Lock)

    def models_header(self) -> str:
        """The fixed-size summary, for every answer's header."""
        return self.published.header

    def publish(self) -> None:
        """Snapshot the cache for the answers and the reporter."""
        cache = self.cache
        if cache is not None:
            self.published = Published.of(LoadedModels(
                version=cache.version, capacity=cache.capacity, models=tuple(cache.loaded),
                loading=tuple(cache.loading), model_bytes=cache.model_bytes,
                capacity_bytes=cache.capacity_bytes or 0, failures=tuple(cache.failures)))


STATE = web.AppKey("state", ReplicaState)


def create_app(deployment: Deployment, handler: Any, *, patch_pod: Patch | None = None,
               runtime: Runtime | None = None, internal: TokenFile | None = None) -> web.Application:
    """The replica app for ``handler``; ``patch_pod`` publishes the loaded-models annotation;
    ``runtime`` (the one the handler was built in, by default) gets the app's metrics observers;
    ``internal`` guards the API (None: open)."""
    spec = deployment.spec
    try:
        check_handler(handler)  # one that nothing can call must not start as ready
    except TypeError as error:
        raise SpecError([f"spec.handler: {error}"]) from None
    metrics = ReplicaMetrics(deployment.name, per_model=spec.metrics.model_label)
    state = ReplicaState(
        deployment=deployment,
        handler=handler,
        cache=find_cache(handler),
        metrics=metrics,
        ingress=ingress_for(handler),
        internal=internal,
        user_config=None if spec.user_config is None else config_hash(spec.user_config),  # applied at build
    )
    app = web.Application(middlewares=[error_middleware, internal_only(state.internal)],
                          client_max_size=state.deployment.spec.max_request_bytes)
    app[STATE] = state
    app.router.add_post("/v1/invoke", invoke)
    app.router.add_get(LOADED_MODELS_PATH, list_models)
    app.router.add_get(LOADED_MODELS_PATH + "/{model_id}/metadata", model_metadata)
    app.router.add_post(LOADED_MODELS_PATH + "/{model_id}/load", load_model)
    app.router.add_delete(LOADED_MODELS_PATH + "/{model_id}", unload_model)
    app.router.add_post(PINS_PATH, pin_models)
    app.router.add_post(USER_CONFIG_PATH, apply_user_config)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.cleanup_ctx.append(_lifecycle(patch_pod, runtime or current_runtime()))
    return app


def _lifecycle(patch_pod: Patch | None, runtime: Runtime):
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        state = app[STATE]
        if state.ingress is not None:
            await state.ingress.startup()
        observers: list[tuple[list[Callable[..., Any]], Callable[..., Any]]] = [
                    (runtime.batch_observers, state.metrics.on_batch),
                     (runtime.cache_observers, state.metrics.on_cache_event),
                     (runtime.cache_observers, lambda *_: _cache_changed(state))]
        for hooks, observer in observers:
            hooks.append(observer)
        state.publish()
        if patch_pod is not None and state.cache is not None:
            state.reporter = AnnotationReporter(lambda: state.published.summary, patch_pod)
            await state.reporter.start()
        background = [asyncio.create_task(_prewarm(state), name="prewarm")]
        background += [asyncio.create_task(follow(), name="serve follower") for follow in background_tasks()]
        check = health_check_of(state.handler)
        if check is not None:
            background.append(asyncio.create_task(
                run_checks(check, state.health, state.deployment.spec.health_check), name="check_health"))
        yield
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if state.reporter is not None:
            await state.reporter.stop()
        if state.cache is not None:
            await state.cache.close()
        if state.ingress is not None:
            await state.ingress.shutdown()
        await close_handles()
        for hooks, observer in observers:
            hooks.remove(observer)  # this app's own: another's stay

    return lifecycle


def _cache_changed(state: ReplicaState) -> None:
    """After a load starts, ends or fails, or a model is evicted."""
    state.publish()
    if state.cache is not None:  # (cache events come from the cache)
        state.metrics.observe_cache(state.cache)
    if state.reporter is not None:
        state.reporter.changed()


async def _prewarm(state: ReplicaState) -> None:
    model_ids = state.deployment.spec.multiplexing.prewarm
    if model_ids and state.cache is None:
        log.warning("prewarm is set but the handler has no @multiplexed loader; nothing to prewarm")
    elif model_ids and state.cache is not None:
        started = time.monotonic()
        results = await _load_all(state.cache, model_ids)
        for model_id, result in zip(model_ids, results):
            if isinstance(result, BaseException):
                state.prewarm_errors[model_id] = str(result)
                log.error("prewarming model %r failed: %s", model_id, result)
        log.info("prewarm done: %d model(s) in %.3f s", len(model_ids), time.monotonic() - started)
    await preload_hot_models(state.cache)  # the autoscaler's hot models, room permitting
    state.ready = True


async def _load_all(cache: ModelCache, model_ids: Sequence[str]) -> list[Any]:
    return await asyncio.gather(*(cache.get(m) for m in model_ids), return_exceptions=True)


async def _read_call(request: web.Request, routed: Routed, state: ReplicaState, model_id: str) -> Invocation:
    """What the request asks for: a handle's call envelope, or ``__call__`` with the body (an
    Open Inference Protocol body as an ``InferRequest``; with ``spec.http.request: starlette``,
    a Starlette ``Request``, as Ray Serve gives it)."""
    handler = state.handler
    data = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge → 413
    if routed.oip:
        return oip.oip_invocation(request, routed, handler, data, model_id)
    if state.deployment.spec.http.request == STARLETTE and request.content_type != CALL_CONTENT_TYPE:
        root_path = state.ingress.root_path if state.ingress is not None else ""
        return invocation(handler, "", starlette_request(request, routed, data, root_path))
    if is_json(request.content_type):
        try:
            data = from_json(data)
        except ValueError as error:
            raise BadRequest(f"body is not valid JSON: {error}") from None
    return invocation(handler, request.content_type, data)


async def _read_body(request: web.Request, state: ReplicaState, model_id: str) -> None:
    """Read (and keep: ``request.read()`` caches it) the body within ``spec.router.bodyTimeoutSeconds``;
    408 and a closed connection when it does not arrive in time."""
    timeout = state.deployment.spec.router.body_timeout_seconds
    try:
        await read_body(request, timeout)
    except RequestTimeout:
        state.metrics.observe_request(model_id, RequestTimeout.status, timeout)
        # No force_close: aiohttp sends the 408, then reads (lingers on) the rest for a while and
        # closes; closing at once with unread bytes would reset the connection, losing the 408.
        raise
    except web.HTTPException as error:
        state.metrics.observe_request(model_id, error.status, 0.0)
        raise


async def invoke(request: web.Request) -> web.StreamResponse:
    """One request for the handler; the model id is in the ``serve_multiplexed_model_id`` header."""
    state = request.app[STATE]
    # What the router said of the request (user code never sees it: an ASGI scope, the one view of
    # headers user code gets, leaves every internal one out).
    routed = routed_of(request)
    # No model id: the handler gets an empty one, as in Ray; its @multiplexed loader answers 400
    # naming the header only if it is called without one.
    model_id = checked_model_id(model_id_of(request.headers))
    if state.draining:
        state.metrics.observe_request(model_id, 503, 0.0)
        raise NotReady("replica is shutting down", retry_after=1)
    ingress = state.ingress if request.content_type != CALL_CONTENT_TYPE else None
    if ingress is not None:
        ingress.check(routed)  # 404 outside the route prefix
    # The whole body before a slot or a load: a client trickling its body holds neither.
    await _read_body(request, state, model_id)
    # A request whose model is not loaded waits for the load outside the slots: a load that
    # hangs must stall only its own model (the cache bounds its waiters at maxOngoingRequests).
    loads = bool(model_id) and state.cache is not None and model_id not in state.cache
    limit = state.deployment.spec.max_ongoing_requests
    if not loads and state.inflight >= limit:
        state.metrics.observe_request(model_id, 503, 0.0)
        raise Overloaded(f"replica is at maxOngoingRequests ({limit})", retry_after=1)
    stream_idle_s = state.deployment.spec.router.stream_idle_timeout_seconds
    started = time.perf_counter()
    state.active += 1
    in_slot = False
    status = 500
    try:
        if loads:
            await _load(state, model_id)
        # Admitted work keeps its place: a request whose load finished takes a slot at once.
        state.inflight += 1
        in_slot = True
        state.metrics.inflight_now.inc()
        if ingress is not None and ingress.app is not None:
            response = await ingress.respond(request, routed, model_id, state.models_header,
                                             stream_idle_s=stream_idle_s)
            status = 500 if response.get(STREAM_FAILED) else response.status
            return response
        call = await _read_call(request, routed, state, model_id)
        if call.streams:
            response = await _stream(request, state, call, model_id)
        else:
            answer = await _unary(state, call, model_id)
            if isinstance(answer, Invocation) and answer.responds:  # a Starlette response: it sends itself
                response = await send_response(answer.produced, request, routed, state.handler, model_id,
                                               state.models_header, stream_idle_s=stream_idle_s)
            elif isinstance(answer, Invocation):  # a plain request's handler returned a stream: send it as one
                response = await _stream(request, state, answer, model_id)
            else:
                response = _answer(call, *answer, state.models_header())
        status = 500 if response.get(STREAM_FAILED) else response.status
        return response
    except BaseException as error:
        status = status_of(error)
        raise
    finally:
        state.active -= 1
        if in_slot:
            state.inflight -= 1
            state.metrics.inflight_now.dec()
        state.metrics.observe_request(model_id, status, time.perf_counter() - started)


def _answer(call: Invocation, payload: bytes, content_type: str, models_header: str) -> web.Response:
    response = web.Response(body=payload, content_type=content_type.split(";")[0], charset=_charset(content_type))
    response.headers[LOADED_MODELS_HEADER] = models_header
    oip.finish(call, response)
    return response


def _pinned(state: ReplicaState, model_id: str):
    """Keep the request's model loaded while it is served."""
    return state.cache.pinned(model_id) if state.cache is not None and model_id else nullcontext()


async def _load(state: ReplicaState, model_id: str) -> None:
    """Wait until the request's model is loaded; its errors as the handler's."""
    try:
        if state.cache is not None:  # a request loads its model only where there is a cache
            await state.cache.get(model_id)
    except Exception as error:  # noqa: BLE001 - the user's loader
        raise _handler_error(error) from None


def _handler_error(error: Exception, call: Invocation | None = None) -> ModelplexError:
    if isinstance(error, ModelplexError):
        return error
    # The user's exception type (and its module) travels to a handle, with where it was raised,
    # as Ray's errors carry it; a plain HTTP client gets the type and message only.
    return HandlerError.of(error, with_traceback=call is not None and call.typed)


async def _unary(state: ReplicaState, call: Invocation, model_id: str) -> tuple[bytes, str] | Invocation:
    """The handler's answer, encoded (or the stream it returned)."""
    if call.mode == "sync":  # a blocking handler: a worker thread of the user loop, at its priority
        return await asyncio.to_thread(_call_sync, state, call, model_id)
    return await _call_async(state, call, model_id)


async def _call_async(state: ReplicaState, call: Invocation, model_id: str) -> tuple[bytes, str] | Invocation:
    set_multiplexed_model_id(model_id)  # this task's own context
    try:
        with _pinned(state, model_id):
            return call.outcome(await call.run())
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's code: report, never a traceback
        if not isinstance(error, ModelplexError):
            log.exception("handler failed")
        raise _handler_error(error, call) from None


def _call_sync(state: ReplicaState, call: Invocation, model_id: str) -> tuple[bytes, str] | Invocation:
    set_multiplexed_model_id(model_id)  # to_thread runs this in a copy of the caller's context
    try:
        return call.outcome(call.run())
    except Exception as error:  # noqa: BLE001
        if not isinstance(error, ModelplexError):
            log.exception("handler failed")
        raise _handler_error(error, call) from None


async def _generate(state: ReplicaState, call: Invocation, model_id: str) -> AsyncIterator[Any]:
    """The handler's stream (a sync generator's items come from a thread)."""
    set_multiplexed_model_id(model_id)
    with _pinned(state, model_id):
        async for chunk in call.items():
            yield chunk


async def _stream(request: web.Request, state: ReplicaState, call: Invocation, model_id: str) -> web.StreamResponse:
    """Send each chunk as it is produced. Errors before the first chunk get a JSON error;
    after it, the stream ends with an error record and the connection is cut, so a client
    never mistakes a broken stream for a finished one."""
    sse = "text/event-stream" in request.headers.get("Accept", "")
    chunks = TakingTurns(lambda: _generate(state, call, model_id))
    try:
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = None
        except Exception as error:  # noqa: BLE001
            if not isinstance(error, ModelplexError):
                log.error("streaming handler failed before its first chunk: %r", error)
            raise _handler_error(error, call) from None
        response = web.StreamResponse(headers={
            "Content-Type": call.stream_content_type(first, sse), LOADED_MODELS_HEADER: state.models_header()})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if first is None:
            await response.write_eof()
            return response
        # A client that stops reading (StreamIdle, a ConnectionResetError) has left: 499, slot freed.
        idle_s = state.deployment.spec.router.stream_idle_timeout_seconds
        try:
            await write_chunk(request, response, call.frame(first, sse), idle_s)
            async for chunk in chunks:
                await write_chunk(request, response, call.frame(chunk, sse), idle_s)
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away: the finally below stops the producer
        except Exception as error:  # noqa: BLE001
            log.error("streaming handler failed mid-stream: %r", error)
            try:
                await response.write(call.error_frame(_handler_error(error, call), sse))
            except ConnectionResetError:
                pass
            return cut_stream(request, response)
        await response.write_eof()
        return response
    finally:
        await chunks.aclose()


def _charset(content_type: str) -> str | None:
    return "utf-8" if "charset" in content_type else None


async def model_metadata(request: web.Request) -> web.Response:
    """Open Inference Protocol model metadata; the model is loaded if it is not."""
    state = request.app[STATE]
    model_id = validate_model_id(request.match_info["model_id"])  # a 400 unless valid
    return web.json_response(await oip.model_metadata(state.handler, state.cache, model_id))


async def list_models(request: web.Request) -> web.Response:
    return web.Response(body=request.app[STATE].published.body, content_type="application/json")


def _require_cache(state: ReplicaState) -> ModelCache:
    if state.cache is None:
        raise NotFound("this handler has no @multiplexed model loader")
    return state.cache


async def load_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    model_id = validate_model_id(request.match_info["model_id"])  # a 400 unless valid
    started = time.monotonic()
    await _require_cache(state).get(model_id)
    return web.json_response({"model": model_id, "loaded": True, "seconds": round(time.monotonic() - started, 6)})


async def unload_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    model_id = validate_model_id(request.match_info["model_id"])  # a 400 unless valid
    if not await _require_cache(state).evict(model_id):
        raise NotFound(f"model {model_id!r} is not loaded")
    return web.json_response({"model": model_id, "loaded": False})


async def pin_models(request: web.Request) -> web.Response:
    """Lease models (``spec.models`` ``minCopies``: the routers place and renew them) and load
    those not loaded (:mod:`modelplex.wire.pins`)."""
    state = request.app[STATE]
    try:
        pins = PinRequest.from_dict(from_json(await request.read()))
    except ValueError as error:
        raise BadRequest(str(error)) from None
    return web.json_response(await pin(_require_cache(state), pins))


async def apply_user_config(request: web.Request) -> web.Response:
    """Give the handler a new ``userConfig`` (Ray's ``reconfigure`` on a live replica; the operator
    sends it): called on this, the user-code loop, unless the handler already applied that value.
    The answer names what the handler applied; a ``reconfigure`` that raises answers its error,
    and the replica serves on with the value it had."""
    state = request.app[STATE]
    try:
        body = from_json(await request.read())
    except ValueError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from None
    if not isinstance(body, dict) or CONFIG_KEY not in body or body[CONFIG_KEY] is None:
        raise BadRequest(f"the body must be {{{CONFIG_KEY!r}: <a JSON value>}}")
    if not callable(getattr(state.handler, "reconfigure", None)):
        raise BadRequest(f"the handler ({type(state.handler).__qualname__}) has no reconfigure(config) method")
    wanted = config_hash(body[CONFIG_KEY])
    async with state.reconfiguring:
        reconfigured = state.user_config != wanted
        if reconfigured:
            try:
                await reconfigure(state.handler, body[CONFIG_KEY])
            except Exception as error:  # noqa: BLE001 - the user's code: answered, never a crash
                log.error("reconfigure failed (userConfig %s): %r", wanted, error)
                raise _handler_error(error) from None
            state.user_config = wanted
            log.info("reconfigured with userConfig %s", wanted)
    return web.json_response({HASH_KEY: state.user_config, RECONFIGURED_KEY: reconfigured})


async def healthz(request: web.Request) -> web.Response:
    """Alive, unless the handler's check_health failed ``failureThreshold`` times in a row."""
    state = request.app[STATE]
    if state.health.failures >= state.deployment.spec.health_check.failure_threshold:
        raise NotReady(f"unhealthy ({state.health.failures} failed checks in a row): {state.health.reason}")
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.draining:
        raise NotReady("shutting down")
    if not state.ready:
        raise NotReady("prewarming models")
    if state.health.failures:
        raise NotReady(f"unhealthy: {state.health.reason}")
    return web.json_response({"status": "ready", "prewarm_errors": state.prewarm_errors})


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
