"""Invoke connections move to the user-code loop, so their requests reach user code without a hop.

The server loop accepts every connection. One whose first request is ``POST /v1/invoke`` (a
router's pooled connection: it carries invokes and the model endpoints the router forwards; the
router polls over a session of its own) moves to the user loop, where the replica's routes serve
it and user code runs in the request's own task. The hop to the
user loop and back costs each request two wake-ups of the other thread and the GIL changing
hands with them (bench/results/busy-replicas: 10.6 futex calls per request, ~10% of batched
throughput); served here, a request costs neither.

Every other connection (the kubelet's probes, the router's poller, ``curl``) stays on the server
loop, so health, readiness, metrics and the loaded-models document are answered while user code
computes; an invoke that arrives on one of those still reaches user code, through the hop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Callable

from aiohttp import web

from modelplex.serving import JsonErrorRunner
from modelplex_replica.usercode import UserCodeLoop

log = logging.getLogger("modelplex.replica")

#: How a connection whose first request is an invoke begins.
INVOKE_REQUEST_LINE = b"POST /v1/invoke "

#: After the drain, how long the user loop's connections get to finish before they are closed.
CLOSE_TIMEOUT_S = 2.0


class UserLoopConnections:
    """The replica's :class:`~modelplex.serving.ConnectionHandoff`: invoke connections to ``user``'s loop.

    ``make_app`` builds the app that serves them there (the replica's routes, its state); it is
    called on the user loop by :meth:`start`. Until then, and after :meth:`stop`, every
    connection stays on the server loop.
    """

    def __init__(self, user: UserCodeLoop, make_app: Callable[[], web.Application]):
        self._user = user
        self._make_app = make_app
        self._runner: web.AppRunner | None = None
        self._server: web.Server | None = None
        #: Connections moved to the user loop so far.
        self.moved = 0

    async def start(self) -> None:
        """Set up the user loop's server (run this on the user loop)."""
        self._runner = JsonErrorRunner(self._make_app(), access_log=None, handler_cancellation=True,
                                       shutdown_timeout=CLOSE_TIMEOUT_S)
        await self._runner.setup()
        self._server = self._runner.server

    async def stop(self) -> None:
        """Close the connections on the user loop (run this on the user loop, after the drain)."""
        runner, self._runner, self._server = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    def wants(self, first: bytes) -> bool:
        return self._server is not None and first.startswith(INVOKE_REQUEST_LINE)

    def take(self, transport: asyncio.Transport, first: bytes) -> None:
        """On the server loop: the connection's socket goes to the user loop, ``first`` with it."""
        try:
            duplicate = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        except OSError as error:  # out of descriptors: the client sees a closed connection and retries
            log.warning("could not move a connection to the user loop: %s", error)
            transport.abort()
            return
        # Closes the server loop's descriptor only: the duplicate keeps the connection open.
        transport.abort()
        self.moved += 1
        self._user.loop.call_soon_threadsafe(self._adopt, duplicate, first)

    def _adopt(self, sock: socket.socket, first: bytes) -> None:
        server = self._server
        if server is None:  # stopped meanwhile
            sock.close()
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(lambda: _Resumed(server, first), sock))
        task.add_done_callback(lambda done: _adopted(done, sock))


def _adopted(task: asyncio.Task, sock: socket.socket) -> None:
    if task.cancelled() or task.exception() is not None:
        log.warning("could not serve a connection on the user loop: %r", None if task.cancelled() else task.exception())
        sock.close()


class _Resumed(asyncio.Protocol):
    """Hands the connection to the server's protocol, with the bytes the server loop read first."""

    def __init__(self, server: web.Server, first: bytes):
        self._server = server
        self._first = first

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        protocol = self._server()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(self._first)  # before the transport reads on: the order holds
