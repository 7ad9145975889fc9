"""``modelplex router``: serve one deployment's router until SIGINT/SIGTERM: its HTTP API and,
on the same event loop, the Open Inference Protocol over gRPC (:mod:`modelplex_router.grpc`), the
control port (:mod:`modelplex_router.control`: probes and metrics) and, with
``spec.router.endpointPicker.enabled``, the Endpoint Picker (:mod:`modelplex_router.picker`).

It composes the parts: the :class:`~modelplex_router.router.Router`, started first and closed
last; both fronts over it; on SIGTERM both drain (not ready at once, new calls refused, those in
flight finish within the grace)."""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import AsyncIterator

from aiohttp import web

from modelplex.serving import ConnectionLimits, check_credential, check_unguarded_host, freeze_startup_objects, serve
from modelplex.wire.credentials import TokenFile
from modelplex.wire.names import ENV_POD_NAMESPACE
from modelplex.wire.spec import DEFAULT_ENDPOINT_PICKER_PORT, Deployment
from modelplex_router.app import create_app
from modelplex_router.config import RouterConfig
from modelplex_router.control import ControlPort
from modelplex_router.discovery.base import Discovery
from modelplex_router.grpc.server import GrpcServer
from modelplex_router.picker.server import PickerServer
from modelplex_router.router import Router

log = logging.getLogger("modelplex.router")


def make_discovery(deployment: Deployment, replica_urls: list[str], config: RouterConfig) -> Discovery:
    """Static polling when replica URLs are given, else the Kubernetes pod watch."""
    if replica_urls:
        from modelplex_router.discovery.static import StaticDiscovery

        return StaticDiscovery(replica_urls, interval_s=config.poll_interval_s)
    from modelplex_router.discovery.kubernetes import KubernetesDiscovery

    namespace = os.environ.get(ENV_POD_NAMESPACE) or deployment.namespace
    return KubernetesDiscovery(deployment.name, namespace)


def picker_port_of(deployment: Deployment, *, in_pod: bool) -> int | None:
    """The Endpoint Picker's port: None when it is off; ``spec.router.endpointPicker.port``, else
    :data:`~modelplex.wire.spec.DEFAULT_ENDPOINT_PICKER_PORT` in pods and 0 (a free port) locally."""
    picker = deployment.spec.router.endpoint_picker
    if not picker.enabled:
        return None
    return picker.port if picker.port is not None else (DEFAULT_ENDPOINT_PICKER_PORT if in_pod else 0)


def run_router(deployment: Deployment, *, host: str, port: int, replica_urls: list[str] | None = None,
               grpc_port: int = 0, control_port: int | None = 0, picker_port: int | None = None) -> int:
    """Run the router of ``deployment`` on ``host:port`` (HTTP), ``host:grpc_port`` (gRPC; 0: a
    free port, logged), ``host:control_port`` (probes and metrics; 0: a free port, logged;
    None: none) and ``host:picker_port`` (the Endpoint Picker; 0: a free port, logged; None:
    none); blocks, returns the exit code.

    On SIGTERM it turns not-ready, stops listening, and gives the requests it is relaying
    (streams included) ``spec.gracefulShutdownTimeoutSeconds`` to finish."""
    try:
        config = RouterConfig.from_deployment(deployment)
        if config.internal_token_file is None:
            check_unguarded_host(host, "router")
        else:
            check_credential(TokenFile(Path(config.internal_token_file)), "router")
        discovery = make_discovery(deployment, list(replica_urls or ()), config)
    except ValueError as error:
        log.error("%s", error)
        return 2
    router = Router(config, discovery)
    app = create_app(router)
    grpc_server = GrpcServer(router, host, grpc_port)
    limits = ConnectionLimits.of(deployment.spec.router)
    # Its own listener and connection cap: probes and scrapes are answered however full the public port is.
    control = ControlPort(router, host, control_port, limits)
    picker = (PickerServer(router, host, picker_port, fallbacks=deployment.spec.router.endpoint_picker.fallbacks)
              if picker_port is not None else None)
    fronts = (grpc_server, picker) if picker is not None else (grpc_server,)

    async def running(_: web.Application) -> AsyncIterator[None]:
        # With the HTTP server: the Router first (the fronts serve through it), the gRPC front and
        # the control port inside its lifetime; closed in the reverse order once the HTTP requests
        # are done (the control port answers probes, 503 on /readyz, through the whole drain).
        async with router, control, grpc_server, AsyncExitStack() as more:
            if picker is not None:
                await more.enter_async_context(picker)
            yield

    app.cleanup_ctx.append(running)
    freeze_startup_objects()
    source = f"{len(replica_urls)} static replica(s)" if replica_urls else "the Kubernetes API"
    log.info("router for %s on http://%s:%d (replicas from %s, policy %s)",
             deployment.name, host, port, source, config.policy)
    try:
        # Handler cancellation (in serve): a client that hangs up frees its replica slot at once
        # (the proxy then closes the replica's connection, which stops the handler there).
        serve(app, host=host, port=port, grace_s=deployment.spec.graceful_shutdown_timeout_seconds,
              drain=lambda deadline: _drain(router, fronts, deadline), name=f"router of {deployment.name!r}",
              limits=limits)
    except OSError as error:
        log.error("cannot serve on %s (HTTP port %d, gRPC port %s, control port %s, picker port %s): %s", host,
                  port, grpc_port or "any", control_port if control_port is not None else "none",
                  "none" if picker_port is None else picker_port or "any", error)
        return 1
    return 0


async def _drain(router: Router, fronts: tuple[GrpcServer | PickerServer, ...], deadline: float) -> None:
    """Every front: not ready now (``/readyz``, gRPC health), the gRPC calls in flight (the
    picker's streams among them) given until ``deadline``; the HTTP server's own drain follows
    (:func:`modelplex.serving.serve`)."""
    router.drain()
    for front in fronts:
        front.drain(max(0.0, deadline - asyncio.get_running_loop().time()))
