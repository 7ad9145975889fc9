"""``grpc.health.v1.Health`` on the picker's port, as Gateways probe an EPP: the empty name and
``liveness`` are ``SERVING`` while the process runs; ``readiness`` and
``envoy.service.ext_proc.v3.ExternalProcessor`` say what the router's ``/readyz`` says, asked at
each ``Check`` (and every :data:`WATCH_INTERVAL_S` for a ``Watch``), ``NOT_SERVING`` from the
start of a drain. Another name is ``NOT_FOUND`` (``SERVICE_UNKNOWN`` to a ``Watch``), as the
health protocol says.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from grpc_health.v1 import health_pb2

from modelplex_router.picker.http2 import NOT_FOUND, Call, GrpcError

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
#: How often a Watch hears readiness.
WATCH_INTERVAL_S = 0.25
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"


class Health:
    """The statuses of ``live`` (serving while the process runs) and ``ready`` (serving while
    ``ready()`` says so and no drain has begun)."""

    def __init__(self, ready: Callable[[], bool], ready_services: tuple[str, ...], live_services: tuple[str, ...]):
        self._ready = ready
        self.ready_services = ready_services
        self.live_services = live_services
        self.draining = False

    def status(self, service: str) -> int | None:
        """The service's status now; None for a name this port does not serve."""
        if service in self.live_services:
            return SERVING
        if service in self.ready_services:
            return SERVING if not self.draining and self._ready() else NOT_SERVING
        return None

    async def check(self, call: Call) -> None:
        status = self.status((await _request(call)).service)
        if status is None:
            raise GrpcError(NOT_FOUND, "unknown service")
        call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())

    async def watch(self, call: Call) -> None:
        service = (await _request(call)).service
        sent = None
        while True:  # bounded by the call: cancelled when the client goes or the server stops
            status = self.status(service)
            status = SERVICE_UNKNOWN if status is None else status
            if status != sent:
                call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                sent = status
            await asyncio.sleep(WATCH_INTERVAL_S)


async def _request(call: Call) -> health_pb2.HealthCheckRequest:
    async for message in call:
        return health_pb2.HealthCheckRequest.FromString(message)
    return health_pb2.HealthCheckRequest()
