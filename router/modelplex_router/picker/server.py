"""The Endpoint Picker's port: ext_proc (:class:`~modelplex_router.picker.service.Picker`) and
``grpc.health.v1`` (:mod:`modelplex_router.picker.health`) on the lean gRPC server of
:mod:`modelplex_router.picker.http2`, on the router's event loop, with the lifetime of the router's
other fronts: started inside the Router's, bound without ``SO_REUSEPORT``, drained on SIGTERM
(``GOAWAY``, health ``NOT_SERVING``, the streams in flight given the grace period).
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from modelplex_router.picker import health
from modelplex_router.picker.http2 import Call, Http2GrpcServer
from modelplex_router.picker.service import SERVICE_NAME, Picker
from modelplex_router.router import Router

log = logging.getLogger("modelplex.router.picker")

PROCESS = f"/{SERVICE_NAME}/Process"


class PickerServer:
    """The picker of ``router`` on ``host:port`` (0: a free port, see :attr:`port`). The Router
    must be started before this is, and closed after it."""

    what = "Endpoint Picker (envoy.service.ext_proc.v3.ExternalProcessor, grpc.health.v1.Health)"

    def __init__(self, router: Router, host: str, port: int, *, fallbacks: int = 0):
        self.router = router
        self.host = host
        self.port = port
        self.picker = Picker(router, fallbacks=fallbacks)
        self.health = health.Health(lambda: bool(router.readiness()["ready"]), ("readiness", SERVICE_NAME),
                                    ("", "liveness"))
        self._server = Http2GrpcServer({PROCESS: self._process, health.CHECK: self.health.check,
                                        health.WATCH: self.health.watch},
                                       max_message_bytes=router.config.max_request_bytes)
        self._stopping: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PickerServer:
        try:
            await self._server.start(self.host, self.port)
        except OSError as error:
            raise OSError(f"cannot serve the {self.what} on {self.host}:{self.port}: {error.strerror or error}"
                          ) from None
        self.port = self._server.port
        log.info("%s on %s:%d", self.what, self.host, self.port)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self.drain(0)
        assert self._stopping is not None
        await self._stopping

    def drain(self, grace_s: float) -> None:
        """Not serving now; the streams in flight get ``grace_s`` to finish."""
        if self._stopping is None:
            self.health.draining = True
            self._stopping = asyncio.create_task(self._server.stop(grace_s), name="picker drain")

    async def _process(self, call: Call) -> None:
        requests = (ext.ProcessingRequest.FromString(message) async for message in call)
        async for answer in self.picker.Process(requests):
            call.send(answer.SerializeToString())
