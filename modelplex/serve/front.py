"""The HTTP port that ``serve.run``'s applications share (8000, as in Ray), told apart by route prefix.

A request goes to the application whose route prefix is the longest that matches its path (the
prefix ``/a`` matches ``/a`` and ``/a/...``, ``/`` every path), and is relayed to that
application's ingress router as it was sent: method, raw path and query string, headers, body
streamed both ways. The front runs on an event loop in a thread of its own, so a script that
blocks its loop (``serve.run`` itself does, while it starts an application) or has none does
not stall it. Handles do not pass through it: they call each deployment's router.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Mapping

import aiohttp
from aiohttp import web

from modelplex.http import HOP_BY_HOP, error_response, upstream_chunks
from modelplex.wire.forwarded import under_prefix

log = logging.getLogger("modelplex.serve")

#: Headers that describe one hop (or a body the front does not decode), not the message.
_HOP_BY_HOP = HOP_BY_HOP | {"host"}
START_TIMEOUT_S = 30.0
#: How long requests still open may go on once the port closes (their applications stop too).
STOP_GRACE_S = 5.0


def route(routes: Mapping[str, str], path: str) -> str | None:
    """The router URL of the application whose prefix is the longest that ``path`` is under."""
    matching = [prefix for prefix in routes if under_prefix(path, prefix)]
    return routes[max(matching, key=len)] if matching else None


def _where(routes: Mapping[str, str]) -> str:
    prefixes = sorted(routes)
    if not prefixes:
        return "no application with an HTTP route is running"
    if len(prefixes) == 1:
        return f"the application answers under {prefixes[0]}"
    return f"the applications answer under {', '.join(prefixes)}"


class Front:
    """The shared HTTP port: :meth:`start` binds it (``OSError`` when taken), :meth:`set_routes`
    says which router answers under which prefix, :meth:`stop` closes it."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._routes: dict[str, str] = {}  # replaced whole, never changed in place: read by the front's loop
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="modelplex-serve-http", daemon=True)
        self._started = threading.Event()
        self._error: OSError | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise TimeoutError(f"serve.run: the HTTP port {self.port} did not open within {START_TIMEOUT_S:g} s")
        if self._error is not None:
            raise OSError(f"serve.run: cannot listen on {self.host}:{self.port} (set MODELPLEX_SERVE_HTTP_PORT "
                          f"to move it): {self._error}")

    def set_routes(self, routes: Mapping[str, str]) -> None:
        """Which ingress router answers under which route prefix (every application's at once)."""
        self._routes = {prefix: url.rstrip("/") for prefix, url in routes.items()}

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)

    # -- on the front's loop -----------------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._open())
        except OSError as error:
            self._error = error
            self._started.set()
            self._loop.run_until_complete(self._close())
            self._loop.close()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._close())
            self._loop.close()

    async def _open(self) -> None:
        app = web.Application(client_max_size=0)  # bodies stream through: the router bounds them
        app.router.add_route("*", "/{tail:.*}", self._relay)
        # handler_cancellation: a client that goes away closes its request upstream too.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=STOP_GRACE_S)
        await self._runner.setup()
        self._session = aiohttp.ClientSession(auto_decompress=False,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def _close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        target = route(self._routes, request.path)
        if target is None:
            return error_response(404, "not_found", f"no route for {request.path}: {_where(self._routes)}")
        session = self._session
        if session is None:  # set before the port opens
            raise RuntimeError("the front's client session is not open")
        headers = [(name, value) for name, value in request.headers.items() if name.lower() not in _HOP_BY_HOP]
        body = request.content if request.body_exists else None
        try:
            upstream_call = session.request(request.method, target + request.raw_path, headers=headers,
                                                  data=body, allow_redirects=False)
            async with upstream_call as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        response.headers.add(name, value)
                await response.prepare(request)
                try:
                    async for chunk in upstream_chunks(upstream.content):
                        await response.write(chunk)
                except aiohttp.ClientPayloadError:
                    # The answer broke off upstream: cut this one too, so the client sees a cut.
                    if request.transport is not None:
                        request.transport.close()
                    return response
                await response.write_eof()
                return response
        except aiohttp.ClientConnectionError as error:
            log.warning("serve.run: the router at %s did not answer %s %s: %s", target, request.method,
                        request.path, error)
            return error_response(502, "bad_gateway", f"the application's router did not answer: {error}")
