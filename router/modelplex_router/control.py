"""The router's control port: ``/healthz``, ``/readyz`` and ``/metrics`` on a listener of their own.

The kubelet probes it and Prometheus scrapes it (``spec.router.controlPort``: 9091 in pods; in
local mode the value given, else a free port). It has its own connections and its own cap
(``spec.router.maxConnections``), so a public port full of idle or slow clients never makes a
probe fail or a scrape miss: the router serves it on the same event loop, which no user code
ever holds. ``/healthz`` and ``/readyz`` stay on the public port too (clients and load balancers
read them there); ``/metrics`` is here only. Its paths are open: a NetworkPolicy says who reaches
the port (the operator's admits ``metricsFrom`` scrapers there, and only there).
"""

from __future__ import annotations

import logging
from types import TracebackType

from aiohttp import web

from modelplex.http import error_middleware
from modelplex.serving import ConnectionLimits, JsonErrorRunner
from modelplex_router.app import healthz, readyz
from modelplex_router.keys import ROUTER
from modelplex_router.metrics import CONTENT_TYPE
from modelplex_router.router import Router

log = logging.getLogger("modelplex.router")

#: On stop, how long a scrape or probe still open gets to finish.
CLOSE_TIMEOUT_S = 2.0


def control_app(router: Router) -> web.Application:
    """The control port's app over ``router``: health, readiness and metrics, nothing else."""
    app = web.Application(middlewares=[error_middleware])
    app[ROUTER] = router
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def metrics(request: web.Request) -> web.Response:
    """The router's Prometheus metrics (``modelplex_router_*``)."""
    body = request.app[ROUTER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


class ControlPort:
    """``async with ControlPort(router, host, port, limits):`` serves :func:`control_app` on
    ``host:port`` (0: a free port, see :attr:`port`; None: not at all) while the router runs."""

    def __init__(self, router: Router, host: str, port: int | None, limits: ConnectionLimits):
        self.router = router
        self.host = host
        self.port = port
        self.limits = limits
        self._runner: JsonErrorRunner | None = None

    async def __aenter__(self) -> ControlPort:
        if self.port is None:
            return self
        runner = JsonErrorRunner(control_app(self.router), limits=self.limits, access_log=None,
                                 shutdown_timeout=CLOSE_TIMEOUT_S)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()  # OSError when the port is taken: the router does not start
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]  # the port bound (a free one when 0 was asked)
        log.info("control port (/healthz, /readyz, /metrics) on http://%s:%d", self.host, self.port)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
