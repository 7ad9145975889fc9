"""The router's gRPC front: grpcio's asyncio server on the router's own event loop, over a
:class:`~modelplex_router.router.Router` (no aiohttp app): ``async with GrpcServer(router, host,
port):`` serves while the Router runs (:mod:`modelplex_router.server` nests it inside the Router's
lifetime).

It serves :class:`~modelplex_router.grpc.service.InferenceService` and the standard health
service (``grpc.health.v1.Health``, :mod:`modelplex_router.grpc.health`): the empty service name
is ``SERVING`` while the process runs; ``inference.GRPCInferenceService`` is ``SERVING`` while
``/readyz`` says ready, from the moment it does (a Check asks readiness itself; a Watch hears it
within :data:`HEALTH_INTERVAL_S`), ``NOT_SERVING`` from the start of a drain.

The port is bound without ``SO_REUSEPORT`` (grpcio sets it by default), so a port in use is an
error, not a second server sharing it. Messages up to ``spec.maxRequestBytes`` are accepted,
as the REST side accepts bodies.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2_grpc

from modelplex_router.grpc import messages
from modelplex_router.grpc.health import SERVING, ReadinessHealth
from modelplex_router.grpc.service import InferenceService, handler
from modelplex_router.router import Router

log = logging.getLogger("modelplex.router.grpc")

#: How often a Watch of the inference service hears readiness (a Check asks it at once).
HEALTH_INTERVAL_S = 0.25


class GrpcServer:
    """The gRPC front of ``router``, on ``host:port`` (0: a free port, see :attr:`port`). The
    Router must be started before this is, and closed after it."""

    #: The health service's names that follow readiness (the others: the empty name).
    ready_services: tuple[str, ...] = (messages.SERVICE_NAME,)
    #: The health service's names that are ``SERVING`` while the process runs.
    live_services: tuple[str, ...] = ("",)
    #: What the log line says is served.
    what = "gRPC (inference.GRPCInferenceService, grpc.health.v1.Health)"

    def __init__(self, router: Router, host: str, port: int):
        self.router = router
        self.host = host
        self.port = port
        self.health = ReadinessHealth(lambda: bool(router.readiness()["ready"]), self.ready_services)
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Task | None = None
        self._follower: asyncio.Task | None = None

    async def __aenter__(self) -> GrpcServer:
        await self.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.stop(0)

    async def start(self) -> None:
        """Bind and start serving; ``OSError`` naming the address when it cannot be bound."""
        options = [
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", self.router.config.max_request_bytes),
            ("grpc.max_send_message_length", -1),
        ]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((handler(InferenceService(self.router)),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            self.port = server.add_insecure_port(f"{_bracketed(self.host)}:{self.port}")
        except RuntimeError:
            raise OSError(f"cannot serve {self.what} on {self.host}:{self.port}: the address is in use or not "
                          "available") from None
        await server.start()
        self._server = server
        for service in self.live_services:
            await self.health.set(service, SERVING)
        await self.health.follow()
        self._follower = asyncio.create_task(self._follow_readiness(), name="grpc health")
        log.info("%s on %s:%d", self.what, self.host, self.port)

    def drain(self, grace_s: float) -> None:
        """Stop taking calls now; those in flight get ``grace_s`` to finish (awaited by :meth:`stop`)."""
        if self._server is not None and self._stopping is None:
            self._stopping = asyncio.create_task(self._drain(grace_s), name="grpc drain")

    async def _drain(self, grace_s: float) -> None:
        await self.health.not_serving()
        if self._server is not None:
            await self._server.stop(grace_s)

    async def stop(self, grace_s: float) -> None:
        """Stop (within ``grace_s`` unless a drain already runs) and wait until stopped."""
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
            self._follower = None
        self.drain(grace_s)
        if self._stopping is not None:
            await self._stopping

    async def _follow_readiness(self) -> None:
        while self._stopping is None:  # bounded by the server's life: cancelled when it stops
            await asyncio.sleep(HEALTH_INTERVAL_S)
            if self._stopping is None:
                await self.health.follow()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
