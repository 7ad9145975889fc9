"""The router's ``grpc.health.v1.Health``: its service follows readiness at once.

The empty service name is ``SERVING`` while the process runs. ``inference.GRPCInferenceService``
says what ``/readyz`` says, asked at the moment of each ``Check`` (a client that checks the
service by name right after the router turned ready sees it serving, as ``/readyz`` does); a
``Watch`` hears changes as the server's follower sets them (:mod:`modelplex_router.grpc.server`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from grpc_health.v1 import health, health_pb2

from modelplex_router.grpc import messages

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ReadinessHealth(health.aio.HealthServicer):
    """The health service, ``inference.GRPCInferenceService`` (or the ``services`` given: the
    Endpoint Picker's) as ``ready()`` says now."""

    def __init__(self, ready: Callable[[], bool], services: Iterable[str] = (messages.SERVICE_NAME,)) -> None:
        super().__init__()
        self._ready = ready
        self.services = tuple(services)

    async def follow(self) -> None:
        """Set the services' status from readiness now (for Watch, and drains)."""
        status = SERVING if self._ready() else NOT_SERVING
        for service in self.services:
            await self.set(service, status)

    async def not_serving(self) -> None:
        """The services are not serving (a drain)."""
        for service in self.services:
            await self.set(service, NOT_SERVING)

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        if request.service in self.services:
            await self.follow()
        return await super().Check(request, context)
