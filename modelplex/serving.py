"""Running an aiohttp app as a router or replica process: JSON errors everywhere, graceful drains.

:func:`serve` replaces ``web.run_app`` for both servers:

- On SIGTERM (or SIGINT) the process turns not-ready first (the ``drain`` callback: ``/readyz``
  answers 503 from then on), lets the callback finish what runs (bounded by the grace), then
  stops listening and gives the requests still open what is left of the grace before they are
  cancelled. ``spec.gracefulShutdownTimeoutSeconds`` is that grace, in pods and in local mode.
- The event loop is uvloop's: the router's and the replica's server loops spend about 15% less
  CPU per request on it than on asyncio's own (bench/results/busy-replicas: the batched
  workload through router and replica, interleaved runs).
- Every 4xx/5xx is JSON, including the ones aiohttp's HTTP parser answers before any handler or
  middleware runs (a 64 KB header, too many headers, a NUL in a header, a garbage request
  line). aiohttp has no public hook for those (aio-libs/aiohttp#3287): its connection protocol
  answers them from ``RequestHandler.handle_error``, which this module's protocol overrides.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import signal
import typing
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Awaitable, Callable

import uvloop
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from modelplex.http import to_json
from modelplex.wire.credentials import ENV_INTERNAL_TOKEN_FILE, TokenFile
from modelplex.wire.errors import error_document
from modelplex.wire.spec import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, RouterSpec

log = logging.getLogger("modelplex.serving")

#: Drains at most this long past the grace: aiohttp's own cancellation of what is left.
_CANCEL_MARGIN_S = 2.0

Drain = Callable[[float], Awaitable[None]]

_OVER_CAP_BODY = to_json(error_document("overloaded", "too many open connections; retry"))
_OVER_CAP = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
             b"Connection: close\r\nContent-Length: " + str(len(_OVER_CAP_BODY)).encode() + b"\r\n\r\n"
             + _OVER_CAP_BODY)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server allows a connection (``spec.router``'s bounds, the replica's too).

    - ``header_timeout_s``: a connection that has not sent a whole request head this long after
      it opened (or after the first byte of its next request) is closed without an answer;
    - ``idle_timeout_s``: a keep-alive connection with no request this long is closed;
    - ``max_connections``: one more connection gets a 503 JSON and is closed (None: no cap).
    """

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS

    @classmethod
    def of(cls, router: RouterSpec) -> ConnectionLimits:
        return cls(router.header_timeout_seconds, router.idle_timeout_seconds, router.max_connections)


class UnguardedHost(ValueError):
    """A router or replica with no internal credential asked to listen beyond loopback."""


def check_unguarded_host(host: str, what: str) -> None:
    """A server without an internal credential runs on loopback only (with a warning): local
    mode and pods always give one; elsewhere it would let anyone who reaches it in."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise UnguardedHost(f"a {what} on {host} needs an internal credential: set {ENV_INTERNAL_TOKEN_FILE} "
                            "to a file holding it (local mode and pods set it)")
    log.warning("no internal credential (%s): the %s's internal API is open to anyone on this machine",
                ENV_INTERNAL_TOKEN_FILE, what)


def check_credential(token: TokenFile, what: str) -> None:
    """A server whose credential file cannot be read would refuse everyone (401) without saying
    why: it refuses to start instead, naming the file."""
    if token.token() is None:
        raise UnguardedHost(f"the {what}'s internal credential {token.path} is missing, empty or unreadable "
                            f"by this user ({ENV_INTERNAL_TOKEN_FILE})")


class JsonErrorProtocol(RequestHandler):
    """aiohttp's connection protocol, answering its own (parser-level) errors in JSON, and closing
    a connection whose request head does not arrive in time (aiohttp has no header timeout: a
    silent socket or half a request line would otherwise hold a slot until keep-alive ends)."""

    #: Closes the connection unless a whole request head arrives first; None while none is awaited.
    _head_timer: asyncio.TimerHandle | None = None
    #: Request heads parsed when the timer was last settled (aiohttp counts them as they come).
    _heads_seen = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._request_count != self._heads_seen:  # a whole head arrived
            self._heads_seen = self._request_count
            self._settle_head()
        elif data and self._head_timer is None and self._waiter is not None and not self._waiter.done():
            self._await_head()  # the first bytes of an idle keep-alive connection's next request

    def connection_lost(self, exc: BaseException | None) -> None:
        self._settle_head()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        timeout = getattr(self._manager, "header_timeout_s", None)
        if timeout is not None:
            self._head_timer = self._loop.call_later(timeout, self._head_overdue)

    def _settle_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self._request_count == self._heads_seen and self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            log.debug("closed a connection from %s: no whole request head in time", peer[0] if peer else "?")
            self.force_close()

    #: While answering a client's malformed request, what was wrong with it: aiohttp's ERROR with a
    #: traceback becomes one WARNING line (the client's mistake, not the server's).
    _client_error: str | None = None

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        detail = (message or "").strip().splitlines()
        self._client_error = (detail[0] if detail else "malformed HTTP request") if status < 500 else None
        try:
            plain = super().handle_error(request, status, exc, message)  # logs it; refuses after output
        finally:
            self._client_error = None
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Error"
        if status >= 500:
            text = "internal error; see the server log"
        else:
            detail = (message or "").strip().splitlines()
            text = f"malformed HTTP request: {detail[0]}" if detail else "malformed HTTP request"
        body = error_document(reason.lower().replace(" ", "_"), text)
        response = web.Response(status=plain.status, body=to_json(body), content_type="application/json")
        response.force_close()
        return response


    def log_exception(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        if self._client_error is None:
            super().log_exception(*args, **kwargs)
            return
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        log.warning("malformed request from %s: %s", peer[0] if peer else "?", self._client_error)


class _OverCap(asyncio.Protocol):
    """A connection over the server's cap: a 503 JSON answer, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(_OVER_CAP)  # type: ignore[attr-defined]
        transport.close()

    def data_received(self, data: bytes) -> None:
        pass


class _JsonErrorServer(web.Server):
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float | None = DEFAULT_HEADER_TIMEOUT_S

    # The loop takes any protocol from a server's factory; aiohttp's annotation names its own.
    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]
        if self.max_connections is not None and len(self.connections) >= self.max_connections:
            return _OverCap()
        return self.protocol()

    def protocol(self) -> RequestHandler:
        return JsonErrorProtocol(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """An ``AppRunner`` whose connections answer parser errors with :class:`JsonErrorProtocol`
    and keep to ``limits`` (:class:`ConnectionLimits`: header and idle timeouts, a cap on open
    connections)."""

    def __init__(self, app: web.Application, *, limits: ConnectionLimits = ConnectionLimits(),
                 **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=limits.idle_timeout_s, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The app's own Server, built by aiohttp as usual; only the protocol it makes differs.
        server.__class__ = _JsonErrorServer
        ours = typing.cast(_JsonErrorServer, server)
        ours.max_connections = self._limits.max_connections
        ours.header_timeout_s = self._limits.header_timeout_s
        return ours


def freeze_startup_objects() -> None:
    """Collect the garbage of start-up, then move every object left to the collector's permanent
    generation (``gc.freeze``, as Ray Serve does for its replicas and proxy): the imports (torch's
    among them) and what a server built live as long as the process, so no later collection walks
    them again (a replica's start-up took ~125 ms a full pass on the thread that serves,
    bench/results/small-machine-2026-11-28c). A replica calls it before user code runs: a frozen
    object in a reference cycle is never freed, and a handler's models (a TorchScript module
    lives in cycles) must stay free to go."""
    gc.collect()
    gc.freeze()
    log.debug("%d start-up objects frozen out of garbage collection", gc.get_freeze_count())


def serve(app: web.Application, *, host: str, port: int | None, grace_s: float, drain: Drain | None = None,
          name: str = "server", limits: ConnectionLimits = ConnectionLimits()) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM/SIGINT, then drain within ``grace_s``.

    ``drain(deadline)`` (a loop time) is awaited first: it turns the app not-ready and may wait
    for its own work to finish; then the listener closes and the requests still open get the
    rest of the grace. Raises ``OSError`` when the address cannot be bound. ``port`` None: no
    listener (the app's startup and cleanup still run: a replica whose requests are all served
    by its user loop's own listener, and no control port).
    """
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(app, host, port, grace_s, drain, name, limits))


async def _serve(app: web.Application, host: str, port: int | None, grace_s: float, drain: Drain | None,
                 name: str, limits: ConnectionLimits) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # handler_cancellation: a client that goes away cancels its request's work.
    runner = JsonErrorRunner(app, limits=limits, access_log=None, handler_cancellation=True, shutdown_timeout=grace_s)
    await runner.setup()
    started = loop.time()
    try:
        if port is not None:
            await web.TCPSite(runner, host, port).start()
        await stop.wait()
        started = loop.time()
        deadline = started + grace_s
        log.info("%s: stopping; finishing requests in flight (up to %g s)", name, grace_s)
        if drain is not None:
            try:
                await asyncio.wait_for(drain(deadline), timeout=grace_s)
            except TimeoutError:
                pass
        # What is left of the grace, for the requests still open (set before cleanup reads it).
        runner._shutdown_timeout = max(0.0, deadline - loop.time()) + _CANCEL_MARGIN_S
    finally:
        await runner.cleanup()
    log.info("%s: stopped after %.1f s", name, loop.time() - started)
