"""The Endpoint Picker's port: ext_proc (:class:`~modelplex_router.picker.service.Picker`) and
``grpc.health.v1`` on grpcio's asyncio server, on the router's event loop, with the lifetime of
the router's gRPC front (:class:`~modelplex_router.grpc.server.GrpcServer`: bound without
``SO_REUSEPORT``, drained on SIGTERM).

Health, as Gateways probe an EPP: the empty name and ``liveness`` are ``SERVING`` while the
process runs; ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor`` follow the
router's readiness (``/readyz``), ``NOT_SERVING`` from the start of a drain.
"""

from __future__ import annotations

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from modelplex_router.grpc.server import GrpcServer
from modelplex_router.picker.service import SERVICE_NAME, Picker
from modelplex_router.router import Router


class PickerServer(GrpcServer):
    """The picker of ``router`` on ``host:port`` (0: a free port, see :attr:`port`)."""

    ready_services = ("readiness", SERVICE_NAME)
    live_services = ("", "liveness")
    what = "Endpoint Picker (envoy.service.ext_proc.v3.ExternalProcessor, grpc.health.v1.Health)"

    def __init__(self, router: Router, host: str, port: int, *, fallbacks: int = 0):
        super().__init__(router, host, port)
        #: ``spec.router.endpointPicker.fallbacks`` (:class:`~modelplex_router.picker.service.Picker`).
        self.fallbacks = fallbacks

    def register(self, server: grpc.aio.Server) -> None:
        ext_grpc.add_ExternalProcessorServicer_to_server(Picker(self.router, fallbacks=self.fallbacks), server)
