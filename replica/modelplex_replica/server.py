"""``modelplex replica``: serve one deployment's handler on the internal API."""

from __future__ import annotations

import logging

from aiohttp import web

from modelplex.spec import Deployment
from modelplex_replica.app import create_app
from modelplex_replica.handler import build_handler
from modelplex_replica.reporter import pod_patcher_from_environment

log = logging.getLogger("modelplex.replica")


def run_replica(deployment: Deployment, *, host: str, port: int) -> int:
    """Block serving until SIGINT/SIGTERM; in-flight requests get up to 30 s to finish."""
    handler = build_handler(deployment)
    app = create_app(deployment, handler, patch_pod=pod_patcher_from_environment())
    log.info("replica of %r serving on http://%s:%d (handler %s)", deployment.name, host, port,
             deployment.spec.handler or "built-in TorchScript")
    # handler_cancellation: a client that goes away cancels its request's work.
    web.run_app(app, host=host, port=port, access_log=None, print=None, shutdown_timeout=30,
                handler_cancellation=True)
    return 0
