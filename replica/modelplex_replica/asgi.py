"""HTTP requests for a deployment that serves them itself: its ``serve.ingress`` ASGI app, and
its route prefix.

The router forwards every request to the replica's ``POST /v1/invoke`` with the client's
method, raw path and headers (:mod:`modelplex.wire.forwarded`). A request outside the deployment's
route prefix is a 404; one inside it goes to the ASGI app (a FastAPI app), run on the user-code
loop like every handler, with ``root_path`` set to the prefix, the deployment's instance as a
class-based route's ``self`` and the request's model id for ``serve.get_multiplexed_model_id()``.
The app's answer streams back as it is sent: a body sent in one message is answered at once,
a streamed one (``StreamingResponse``) chunk by chunk; a response that fails part way is cut,
so the client never takes it for a whole one. The app's lifespan (startup and shutdown
events) runs with the replica: a failed startup fails the replica's start, as in Ray.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping
from urllib.parse import unquote

from aiohttp import web
from multidict import CIMultiDict

from modelplex.context import set_multiplexed_model_id
from modelplex.http import HOP_BY_HOP, write_chunk
from modelplex.serve.ingress import asgi_app, current_instance
from modelplex.wire.errors import HandlerError, ModelplexError, NotFound
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX, NO_ROUTE, check_route_prefix, under_prefix
from modelplex.wire.names import LOADED_MODELS_HEADER
from modelplex.wire.spec import DEFAULT_STREAM_IDLE_TIMEOUT_S
from modelplex_replica.intake import Routed, client_raw_headers
from modelplex_replica.streams import cut_stream
from modelplex_replica.usercode import TakingTurns

log = logging.getLogger("modelplex.replica.asgi")

#: The app's response headers that describe one hop, and its length: aiohttp sets its own.
_HOP_BY_HOP = frozenset(name.encode() for name in HOP_BY_HOP | {"content-length"})
LIFESPAN_TIMEOUT_S = 60.0
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_DONE = object()


def ingress_for(handler: Any, env: Mapping[str, str] = os.environ) -> HttpIngress | None:
    """How HTTP requests reach ``handler``: None where the default applies (every path goes to
    its ``__call__`` with the body), else its ASGI app and route prefix."""
    app = asgi_app(handler)
    raw = env.get(ENV_ROUTE_PREFIX, "/")
    prefix = raw if raw == NO_ROUTE else check_route_prefix(raw)
    if app is None and prefix == "/":
        return None
    return HttpIngress(prefix, app, handler)


@dataclass
class HttpIngress:
    """A deployment's route prefix, and the ASGI app (None: ``__call__``) that answers under it."""

    prefix: str
    app: Any
    instance: Any
    #: What the app's lifespan startup put in its ``state``: each request gets a copy.
    state: dict[str, Any] = field(default_factory=dict)
    _lifespan: asyncio.Task | None = None
    _shutdown: asyncio.Event | None = None

    def check(self, routed: Routed) -> None:
        """NotFound for a request outside the route prefix (one that did not come through the
        router's catch-all route, such as ``/v1/models/{m}/predict``, has no path to check)."""
        if routed.raw_path is None and self.prefix != NO_ROUTE:
            return
        path = (routed.raw_path or "/").partition("?")[0]
        if not under_prefix(path, self.prefix):
            if self.prefix == NO_ROUTE:
                raise NotFound("this deployment has no HTTP route (route_prefix=None): call it through a handle")
            raise NotFound(f"no route for {path}: this deployment answers under {self.prefix}")

    def serves(self, content_type: str, call_content_type: str) -> bool:
        """Whether the app answers this request (a handle's call goes to the method it names)."""
        return self.app is not None and content_type != call_content_type

    @property
    def root_path(self) -> str:
        """The ASGI ``root_path``: the route prefix (empty for ``/`` and for no route)."""
        return "" if self.prefix in ("/", NO_ROUTE) else self.prefix

    # -- requests ----------------------------------------------------------------------------------

    async def respond(self, request: web.Request, routed: Routed, model_id: str,
                      loaded_models: Callable[[], str], *,
                      stream_idle_s: float = DEFAULT_STREAM_IDLE_TIMEOUT_S) -> web.StreamResponse:
        """The app's answer to ``request`` (its client's, no internal header left: see
        :mod:`modelplex_replica.intake`), relayed as the app sends it; a streamed answer whose
        client reads nothing for ``stream_idle_s`` is cut (:func:`modelplex.http.write_chunk`)."""
        body = await request.read()
        scope = asgi_scope(request, routed, root_path=self.root_path, state=dict(self.state))
        messages = TakingTurns(lambda: self._serve(scope, body, model_id))
        try:
            start = await _next(messages, "a response")
            if start.get("type") != "http.response.start":
                raise HandlerError(f"the ingress app sent {start.get('type')!r} before http.response.start",
                                   error_type="RuntimeError")
            headers = CIMultiDict((name.decode("latin-1"), value.decode("latin-1"))
                                  for name, value in start.get("headers", ()) if name.lower() not in _HOP_BY_HOP)
            headers[LOADED_MODELS_HEADER] = loaded_models()
            status = int(start.get("status", 200))
            first = await _next(messages, "its response body")
            if not first.get("more_body", False):
                return web.Response(status=status, headers=headers, body=first.get("body", b""))
            response = web.StreamResponse(status=status, headers=headers)
            response.enable_chunked_encoding()
            await response.prepare(request)
            try:
                await write_chunk(request, response, first.get("body", b""), stream_idle_s)
                async for message in messages:
                    await write_chunk(request, response, message.get("body", b""), stream_idle_s)
            except (ConnectionResetError, asyncio.CancelledError):
                raise  # the client went away: closing the stream (below) cancels the app
            except Exception as error:  # noqa: BLE001 - the user's app
                log.error("the ingress app failed mid-response: %r", error)
                return cut_stream(request, response)
            await response.write_eof()
            return response
        finally:
            await messages.aclose()

    # -- the app --------------------------------------------------------------------------------------

    async def _serve(self, scope: dict[str, Any], body: bytes, model_id: str) -> AsyncIterator[dict[str, Any]]:
        """The app's messages for one request, up to its last body message. Work the app does
        after that (background tasks) goes on; a request given up on cancels the app."""
        set_multiplexed_model_id(model_id)
        current_instance.set(self.instance)
        messages: asyncio.Queue = asyncio.Queue(maxsize=1)
        finished = asyncio.Event()  # the response is complete, or nobody reads it any more
        receive = body_receiver(body, finished)

        async def send(message: dict[str, Any]) -> None:
            if not finished.is_set():
                await messages.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as error:  # noqa: BLE001 - the reader raises it
                if finished.is_set():
                    log.error("the ingress app failed after its response: %r", error)
                else:
                    await messages.put(error)
            else:
                if not finished.is_set():
                    await messages.put(_DONE)

        task = asyncio.create_task(run(), name="ingress request")
        complete = False
        try:
            while True:
                message = await messages.get()
                if message is _DONE:
                    raise HandlerError("the ingress app returned before its response was complete",
                                       error_type="RuntimeError")
                if isinstance(message, BaseException):
                    raise message
                yield message
                if message.get("type") == "http.response.body" and not message.get("more_body", False):
                    complete = True
                    return
        finally:
            finished.set()
            if complete:
                _background.add(task)
                task.add_done_callback(_background.discard)
            else:
                task.cancel()

    async def startup(self) -> None:
        """Run the app's lifespan startup (on the user loop); an app without lifespan support is fine."""
        if self.app is None:
            return
        loop = asyncio.get_running_loop()
        started: asyncio.Future = loop.create_future()
        shutdown = self._shutdown = asyncio.Event()
        stopped = loop.create_future()
        step = iter(("lifespan.startup", "lifespan.shutdown"))

        async def receive() -> dict[str, Any]:
            kind = next(step, "lifespan.shutdown")
            if kind == "lifespan.shutdown":
                await shutdown.wait()
            return {"type": kind}

        async def send(message: dict[str, Any]) -> None:
            kind = message.get("type")
            if kind in ("lifespan.startup.complete", "lifespan.startup.failed") and not started.done():
                started.set_result(message)
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed") and not stopped.done():
                stopped.set_result(message)

        async def run() -> None:
            scope = {"type": "lifespan", "asgi": _ASGI, "state": self.state}
            try:
                await self.app(scope, receive, send)
            except Exception as error:  # noqa: BLE001
                if not started.done():  # as the ASGI spec says: an app that raises has no lifespan
                    log.debug("the ingress app does not run a lifespan: %r", error)
                    started.set_result(None)
                else:
                    log.error("the ingress app's lifespan failed: %r", error)
            for future in (started, stopped):
                if not future.done():
                    future.set_result(None)

        self._lifespan = asyncio.create_task(run(), name="ingress lifespan")
        message = await asyncio.wait_for(asyncio.shield(started), LIFESPAN_TIMEOUT_S)
        if message is not None and message["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"the ingress app's startup failed: {message.get('message') or 'no message'}")

    async def shutdown(self) -> None:
        """Run the app's lifespan shutdown (on the user loop)."""
        if self._lifespan is None or self._shutdown is None:  # set together, by startup
            return
        self._shutdown.set()
        try:
            await asyncio.wait_for(self._lifespan, LIFESPAN_TIMEOUT_S)
        except TimeoutError:
            log.warning("the ingress app's shutdown did not finish within %g s", LIFESPAN_TIMEOUT_S)


def body_receiver(body: bytes, finished: asyncio.Event) -> Callable[[], Awaitable[dict[str, Any]]]:
    """An ASGI ``receive`` for a request whose whole ``body`` the replica holds: the body in one
    message, then ``http.disconnect`` once ``finished`` is set."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    return receive


def asgi_scope(request: web.Request, routed: Routed, *, root_path: str = "",
               state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ASGI HTTP scope of ``request`` as its client sent it: the method and raw path (with
    its query string) the router passed on (:class:`~modelplex_replica.intake.Routed`), the
    headers left once the internal ones are removed."""
    path, _, query = (routed.raw_path or "/").partition("?")
    headers = client_raw_headers(request)  # bytes already: ASGI's form
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    local = transport.get_extra_info("sockname") if transport is not None else None
    return {
        "type": "http", "asgi": _ASGI, "http_version": f"{request.version.major}.{request.version.minor}",
        "method": routed.method.upper(), "scheme": "http", "path": unquote(path), "raw_path": path.encode("latin-1"),
        "query_string": query.encode("latin-1"), "root_path": root_path,
        "headers": headers, "client": tuple(peer[:2]) if peer else None,
        "server": tuple(local[:2]) if local else None, "state": state if state is not None else {},
    }


#: Apps still running after their response (background tasks): referenced until they end.
_background: set[asyncio.Task] = set()


async def _next(messages: AsyncIterator[dict[str, Any]], what: str) -> dict[str, Any]:
    try:
        return await messages.__anext__()
    except StopAsyncIteration:
        raise HandlerError(f"the ingress app ended without {what}", error_type="RuntimeError") from None
    except ModelplexError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's app
        log.error("the ingress app failed: %r", error)
        raise HandlerError.of(error) from None
