"""``modelplex router``: serve one deployment's router until SIGINT/SIGTERM: its HTTP API and,
on the same event loop, the Open Inference Protocol over gRPC (:mod:`modelplex_router.grpc`)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from aiohttp import web

from modelplex.wire.names import ENV_POD_NAMESPACE
from modelplex.serving import check_credential, check_unguarded_host, serve
from modelplex.wire.credentials import TokenFile
from modelplex.wire.spec import Deployment
from modelplex_router.app import create_app
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.base import Discovery
from modelplex_router.grpc.server import GrpcServer
from modelplex_router.keys import DRAINING

log = logging.getLogger("modelplex.router")


def make_discovery(deployment: Deployment, replica_urls: list[str], config: RouterConfig) -> Discovery:
    """Static polling when replica URLs are given, else the Kubernetes pod watch."""
    if replica_urls:
        from modelplex_router.discovery.static import StaticDiscovery

        return StaticDiscovery(replica_urls, interval_s=config.poll_interval_s)
    from modelplex_router.discovery.kubernetes import KubernetesDiscovery

    namespace = os.environ.get(ENV_POD_NAMESPACE) or deployment.namespace
    return KubernetesDiscovery(deployment.name, namespace)


def run_router(deployment: Deployment, *, host: str, port: int, replica_urls: list[str] | None = None,
               grpc_port: int = 0) -> int:
    """Run the router of ``deployment`` on ``host:port`` (HTTP) and ``host:grpc_port`` (gRPC;
    0: a free port, logged); blocks, returns the exit code.

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
    app = create_app(config, discovery)
    grpc_server = GrpcServer(app, host, grpc_port)
    app.cleanup_ctx.append(grpc_server.context)  # after the client session and discovery: they serve it
    source = f"{len(replica_urls)} static replica(s)" if replica_urls else "the Kubernetes API"
    log.info("router for %s on http://%s:%d (replicas from %s, policy %s)",
             deployment.name, host, port, source, config.policy)
    try:
        # Handler cancellation (in serve): a client that hangs up frees its replica slot at once
        # (the proxy then closes the replica's connection, which stops the handler there).
        serve(app, host=host, port=port, grace_s=deployment.spec.graceful_shutdown_timeout_seconds,
              drain=lambda deadline: _not_ready(app, grpc_server, deadline), name=f"router of {deployment.name!r}")
    except OSError as error:
        log.error("cannot serve on %s (HTTP port %d, gRPC port %s): %s", host, port, grpc_port or "any", error)
        return 1
    return 0


async def _not_ready(app: web.Application, grpc_server: GrpcServer, deadline: float) -> None:
    app[DRAINING].set()
    grpc_server.drain(max(0.0, deadline - asyncio.get_running_loop().time()))
