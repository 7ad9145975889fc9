"""``inference.GRPCInferenceService`` on the router: each RPC through the REST protocol's path.

Model ids, versions, replica endpoints, readiness and the repository's rules are
:mod:`modelplex_router.oip`'s and the :class:`~modelplex_router.router.Router`'s; requests go through
its :class:`~modelplex_router.proxy.Proxy`
(the same scheduler, queue bounds and retries) and are counted in its metrics under
``protocol="grpc"``. The decisions are the REST request's, through the same functions: each RPC
is a kind of route (:class:`~modelplex_router.door.Route`) for one model id (the request's name;
a model-id metadata entry that differs is refused), authorized by
:func:`modelplex_router.auth.authorize` (the bearer token and the internal credential come as
metadata, ``authorization: Bearer <token>``; model control is off unless
``spec.router.modelControl``, and every attempt at it is in the audit log), and every RPC that
can load a model passes :meth:`~modelplex_router.router.Router.admit` (``onCold``, the load quota).
A router error, or a replica's error answer, ends the call with the JSON
error's message under the code :func:`~modelplex_router.grpc.status.code_for` gives; in
``ModelStreamInfer`` it is the stream's ``error_message`` for that request, as Triton does, and the
stream goes on. RPCs that the router does not serve (model configuration, statistics, shared
memory, tracing, logging) answer ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable
from urllib.parse import quote

import grpc
import orjson

from modelplex.http import StreamIdle
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.errors import (BadRequest, ModelNotFound, ModelplexError, ReplicaFailed, error_for_status,
                                   error_object)
from modelplex.wire.oip import HEADER_LENGTH, STREAM_CONTENT_TYPE, StreamFrames, split_body
from modelplex_router import oip
from modelplex_router.access_log import line
from modelplex_router.access_log import log as access_log
from modelplex_router.auth import Asked, authorize
from modelplex_router.cold import ON_COLD_HEADER, quota_client
from modelplex_router.door import MODEL_CONTROL, Route, header_models, served_model
from modelplex_router.endpoints import load_path, metadata_path
from modelplex_router.grpc import messages
from modelplex_router.grpc.status import code_for, retry_metadata
from modelplex_router.grpc.tensors import FINAL, final_response, infer_response, request_body, wants_empty_final
from modelplex_router.measured import counted
from modelplex_router.proxy import Reply
from modelplex_router.router import Router

log = logging.getLogger("modelplex.router.grpc")

#: What a replica answers a unary OIP request with; anything else came from a generator.
_UNARY_TYPES = ("application/json", "application/octet-stream")


class InferenceService:
    """The RPCs, as methods named after them; :func:`handler` serves them."""

    def __init__(self, router: Router):
        self.router = router

    # -- server ------------------------------------------------------------------------------

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return messages.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return messages.ServerReadyResponse(ready=self.router.readiness()["ready"])

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def answer(caller: str) -> Any:
            return messages.ServerMetadataResponse(**oip.server_metadata_document())

        return await self._answer(context, answer, Route.SERVER, path="/v2")

    # -- models ------------------------------------------------------------------------------

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Ready when a replica holds the model or can load it; not ready when none can."""
        async def answer(caller: str) -> Any:
            model, _ = oip.model_version(request.name, request.version or None)
            if self.router.held(model):
                return messages.ModelReadyResponse(ready=True)
            try:
                await self._metadata(model)
            except ModelplexError as error:
                if error.status != ModelNotFound.status:
                    raise
                return messages.ModelReadyResponse(ready=False)  # no replica can serve it
            return messages.ModelReadyResponse(ready=True)

        return await self._answer(context, answer, Route.MODEL, path=_model_path(request.name, "/ready"),
                                  named=request.name)

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def answer(caller: str) -> Any:
            model, _ = oip.model_version(request.name, request.version or None)
            document = await self._metadata(model)
            response = messages.ModelMetadataResponse(name=document.get("name", model),
                                                      versions=document.get("versions", [oip.VERSION]),
                                                      platform=document.get("platform", ""))
            for field in ("inputs", "outputs"):
                for tensor in document.get(field, []):
                    getattr(response, field).add(name=tensor["name"], datatype=tensor["datatype"],
                                                 shape=tensor["shape"])
            return response

        return await self._answer(context, answer, Route.MODEL, path=_model_path(request.name), model=request.name)

    async def _metadata(self, model: str) -> dict:
        """The model's metadata from a replica (one that holds it, else one that loads it now)."""
        def parse(reply: Reply) -> dict:
            return orjson.loads(reply.first)

        return await self.router.proxy.exchange(model, b"", {}, _checked(parse), method="GET",
                                                path=metadata_path(model))

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def answer(caller: str) -> Any:
            model, version = oip.model_version(request.model_name, request.model_version or None)
            body, header_length = request_body(request)

            def unary(reply: Reply) -> Any:
                if reply.headers.get("Content-Type", "").split(";")[0] not in _UNARY_TYPES:
                    raise BadRequest(f"model {model!r} streams its answers (a generator handler): "
                                     "call ModelStreamInfer")
                return infer_response(reply.first, reply.headers.get(HEADER_LENGTH))

            return await self.router.proxy.exchange(model, body, oip.infer_headers(str(header_length), version),
                                                    _checked(unary))

        return await self._answer(context, answer, Route.MODEL, path=_model_path(request.model_name, "/infer"),
                                  model=request.model_name)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        """Every request of the stream at once; each one's answers as they come, then (when it
        asks with ``triton_enable_empty_final_response``) an empty one marked final."""
        lock = asyncio.Lock()
        idle_s = self.router.config.stream_idle_timeout_s

        async def write(message: Any) -> None:
            async with lock:  # one message at a time on the stream
                # Only the wait for the client to take a message is bounded, never a handler's
                # silence: a client that stops reading frees its requests' slots.
                try:
                    async with asyncio.timeout(idle_s):
                        await context.write(message)
                except TimeoutError:
                    raise StreamIdle(f"the client read nothing for {idle_s:g} s "
                                     "(spec.router.streamIdleTimeoutSeconds): stream cut") from None

        try:
            async with asyncio.TaskGroup() as group:
                async for request in requests:
                    group.create_task(self._stream_one(request, write, context))
        except* StreamIdle as idle:
            log.info("ModelStreamInfer from %s: %s", context.peer(), idle.exceptions[0])
            await context.abort(grpc.StatusCode.CANCELLED, str(idle.exceptions[0]))

    async def _stream_one(self, request: Any, write: Callable[[Any], Awaitable[None]],
                          context: grpc.aio.ServicerContext) -> None:
        async def answer() -> None:
            model, version = oip.model_version(request.model_name, request.model_version or None)
            self._admit(context, metadata, caller, Route.MODEL, model)
            body, header_length = request_body(request)
            headers = {**oip.infer_headers(str(header_length), version), "Accept": STREAM_CONTENT_TYPE}

            async def relay(reply: Reply) -> None:
                _raise_for(reply)
                if reply.headers.get("Content-Type", "").split(";")[0] == STREAM_CONTENT_TYPE:
                    await _relay_frames(reply, write)
                    if wants_empty_final(request):
                        await write(messages.ModelStreamInferResponse(infer_response=final_response(request)))
                    return
                body = reply.first + b"".join([chunk async for chunk in reply.rest])  # a unary handler
                response = infer_response(body, reply.headers.get(HEADER_LENGTH))
                response.parameters[FINAL].bool_param = True
                await write(messages.ModelStreamInferResponse(infer_response=response))

            await self.router.proxy.exchange(model, body, headers, relay, buffer=False)

        try:
            metadata = _metadata(context)
            caller = self._authorize(metadata, Route.MODEL, _model_path(request.model_name, "/infer"),
                                     request.model_name)
            await counted(self.router.metrics, request.model_name, answer, protocol="grpc", status_of=lambda _: 200)
        except StreamIdle:
            raise  # the client stopped reading: the whole call ends (ModelStreamInfer)
        except ModelplexError as error:
            await write(messages.ModelStreamInferResponse(error_message=error.message,
                                                          infer_response=_identity(request)))
        except Exception:  # noqa: BLE001 - one request's fault must not end the others' stream
            log.exception("a streamed inference request failed")
            await write(messages.ModelStreamInferResponse(error_message="internal error; see the router log",
                                                          infer_response=_identity(request)))

    # -- repository extension ----------------------------------------------------------------

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Every model a replica holds (``READY``) or is loading (``LOADING``; not with ``ready``)."""
        async def answer(caller: str) -> Any:
            response = messages.RepositoryIndexResponse()
            for model, state in self.router.repository_states(caller).items():
                if state == "READY" or not request.ready:
                    response.models.add(name=model, version=oip.VERSION, state=state)
            return response

        return await self._answer(context, answer, Route.INDEX, path="/v2/repository/index")

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Load the model on the replica the router would send its requests to."""
        async def answer(caller: str) -> Any:
            model, _ = oip.model_version(request.model_name, None)
            await self.router.proxy.exchange(model, b"", {}, _checked(lambda reply: None), path=load_path(model))
            return messages.RepositoryModelLoadResponse()

        return await self._answer(context, answer, Route.LOAD, path=_repository_path(request.model_name, "load"),
                                  model=request.model_name)

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Evict the model from every replica that holds it."""
        async def answer(caller: str) -> Any:
            model, _ = oip.model_version(request.model_name, None)
            await self.router.unload(model)
            return messages.RepositoryModelUnloadResponse()

        return await self._answer(context, answer, Route.UNLOAD,
                                  path=_repository_path(request.model_name, "unload"), named=request.model_name)

    # -- errors ------------------------------------------------------------------------------

    def _authorize(self, metadata: dict[str, Any], route: Route, path: str, model: str = "") -> str:
        """Refuse what the same REST request would be refused, from the call's ``metadata``: a
        model-id entry that differs from the request's model (400), no or a bad credential
        (401), what the caller may not do (403); the caller's name
        (:func:`~modelplex_router.auth.authorize`). ``path``: the REST path, for messages."""
        model = served_model(model, header_models(metadata)) if model else ""
        scheme, _, token = str(metadata.get("authorization", "")).partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        internal = metadata.get(INTERNAL_TOKEN_HEADER.lower())
        return authorize(self.router.access, Asked(route, path=path, bearer=bearer, model=model,
                                                 internal_token=internal if isinstance(internal, str) else None))

    def _admit(self, context: grpc.aio.ServicerContext, metadata: dict[str, Any], caller: str, route: Route,
               model: str) -> None:
        """``onCold`` (the ``x-modelplex-on-cold`` metadata) and the load quota: the Router's gate,
        as over REST."""
        on_cold = metadata.get(ON_COLD_HEADER)
        client = None  # whose quota: read only where there is one (the peer's address costs a parse per call)
        if self.router.cold.quotas is not None:
            client = quota_client(caller, _peer_address(context))
        self.router.admit(route, model, client, on_cold if isinstance(on_cold, str) else None)

    async def _answer(self, context: grpc.aio.ServicerContext, answer: Callable[[str], Awaitable[Any]],
                      route: Route, *, path: str, model: str | None = None, named: str = "") -> Any:
        """``answer(caller)`` once the request on ``route`` (for the model ``model`` or ``named``)
        passes the door, counted in the metrics when it names a ``model``; its error as the
        call's status. A route that can load the model passes ``onCold`` and the load quota;
        model control is in the audit log, refused or not."""
        started, status, caller = time.perf_counter(), 500, ""
        try:
            metadata = _metadata(context)  # once per call: the access check and the cold gate read it
            caller = self._authorize(metadata, route, path, model or named)

            async def admitted() -> Any:  # refused here, the call is counted like any other
                self._admit(context, metadata, caller, route, model or named)
                return await answer(caller)

            if model is None:
                result = await admitted()
            else:
                result = await counted(self.router.metrics, model, admitted, protocol="grpc", status_of=lambda _: 200)
            status = 200
            return result
        except ModelplexError as error:
            status = error.status
            await context.abort(code_for(error.status), error.message,
                                trailing_metadata=retry_metadata(error.retry_after))
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:  # noqa: BLE001 - never a traceback to the client
            log.exception("a gRPC request failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the router log")
        finally:
            if route in MODEL_CONTROL:  # audited always, as over REST
                access_log.info("%s", line(caller or _peer_address(context) or "", "grpc", path, model or named,
                                           status, time.perf_counter() - started, time.time()))


def _peer_address(context: grpc.aio.ServicerContext) -> str | None:
    """The caller's address, from the call's peer (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    return (context.peer() or "").rpartition(":")[0].partition(":")[2].strip("[]") or None


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, Any]:
    """The call's metadata, keys in lower case."""
    return {key.lower(): value for key, value in context.invocation_metadata() or ()}


def _model_path(model: str, tail: str = "") -> str:
    """The REST path of a model's call (its id percent-encoded, as in a URL)."""
    return f"/v2/models/{quote(model, safe='')}{tail}"


def _repository_path(model: str, action: str) -> str:
    return f"/v2/repository/models/{quote(model, safe='')}/{action}"


def _raise_for(reply: Reply) -> None:
    """A replica's error answer as the error it stands for."""
    if reply.status < 400:
        return
    error = error_for_status(reply.status, *oip.replica_error(reply.first, None))
    retry_after = reply.headers.get("Retry-After")
    if retry_after and retry_after.isdigit():
        error.retry_after = float(retry_after)
    raise error


def _checked(parse: Callable[[Reply], Any]) -> Callable[[Reply], Awaitable[Any]]:
    """A buffered reply's consumer: its error raised, else what ``parse`` makes of it."""
    async def consume(reply: Reply) -> Any:
        _raise_for(reply)
        return parse(reply)

    return consume


async def _relay_frames(reply: Reply, write: Callable[[Any], Awaitable[None]]) -> None:
    """Each framed answer of a streaming handler, as it arrives, written marked not final."""
    frames = StreamFrames()

    async def chunks() -> AsyncIterator[bytes]:
        yield reply.first
        async for chunk in reply.rest:
            yield chunk

    async for chunk in chunks():
        for body, header_length in frames.feed(chunk):
            _raise_for_error_frame(body, header_length)
            response = infer_response(body, header_length)
            response.parameters[FINAL].bool_param = False
            await write(messages.ModelStreamInferResponse(infer_response=response))
    if frames.pending:
        raise ReplicaFailed(f"replica {reply.replica} cut its stream in the middle of an answer")


def _raise_for_error_frame(body: bytes, header_length: int) -> None:
    """The error a stream's last frame reports, raised (a handler that failed mid-stream)."""
    if header_length != len(body):
        return  # it has tensors: an answer
    error = error_object(orjson.loads(split_body(body, header_length)[0]))
    if error is not None:
        raise error_for_status(500, str(error.get("message", "")), error.get("code"), error.get("type"))


def _identity(request: Any) -> Any:
    """An answer that names the request an error belongs to (Triton's clients read its id)."""
    return messages.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                       id=request.id)


def handler(service: InferenceService) -> grpc.GenericRpcHandler:
    """The service's RPCs (those it has a method for), from the vendored proto's descriptors."""
    handlers = {}
    for method in messages.SERVICE.methods:
        function = getattr(service, method.name, None)
        if function is None:
            continue
        request = messages.message(method.input_type.name)
        response = messages.message(method.output_type.name)
        make = _KINDS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(function, request_deserializer=request.FromString,
                                     response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(messages.SERVICE_NAME, handlers)


_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
