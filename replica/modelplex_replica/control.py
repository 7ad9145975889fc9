"""The control port: health, readiness and metrics on the server loop, which never runs user
code; and the user loop, started and stopped with it, serving the API port.

A replica process (``modelplex replica``) listens twice. The API port (``--port``, 9000)
serves the replica's whole API (:func:`modelplex_replica.app.create_app`) on the user loop
(:mod:`modelplex_replica.usercode`): every request runs user code in its own task, with no hop
between threads, and its answers wait while a handler computes (the routers' polls allow for
that: ``router/.../discovery/health.py``). The control port (``--control-port``; 9001 in pods)
answers ``/healthz``, ``/readyz`` and ``/metrics`` only, on the main thread's loop, at once
whatever user code does: the kubelet probes it and Prometheus scrapes it. Its paths are open,
as on the API port (a NetworkPolicy says who reaches the port).
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from aiohttp import web

from modelplex.http import error_middleware
from modelplex.serving import ConnectionLimits, JsonErrorRunner
from modelplex_replica.app import STATE, healthz, metrics_endpoint, readyz
from modelplex_replica.usercode import UserCodeLoop

#: After the drain, how long the API port's connections get to finish before they are closed.
CLOSE_TIMEOUT_S = 2.0


def control_app(api: web.Application, *, host: str, port: int) -> web.Application:
    """The server loop's app: the control routes over ``api``'s state. Its startup starts the
    user loop serving ``api`` on ``host:port`` (an ``OSError`` when the port is taken, a failed
    ingress startup as it is); its cleanup closes that port and ends the user loop."""
    app = web.Application(middlewares=[error_middleware])
    app[STATE] = api[STATE]
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.cleanup_ctx.append(_api_port(api, host, port))
    return app


def _api_port(api: web.Application, host: str, port: int) -> Callable[[web.Application], AsyncIterator[None]]:
    async def serve_api(app: web.Application) -> AsyncIterator[None]:
        user = UserCodeLoop()
        user.start()
        # The API port keeps the router's connection bounds (spec.router): its clients are routers
        # and handles, whose pools idle out before idleTimeoutSeconds.
        limits = ConnectionLimits.of(api[STATE].deployment.spec.router)
        runner = JsonErrorRunner(api, limits=limits, access_log=None, handler_cancellation=True,
                                 shutdown_timeout=CLOSE_TIMEOUT_S)
        try:
            await user.submit(_listen(runner, host, port))
            yield
        finally:
            await user.submit(runner.cleanup())
            await user.stop()

    return serve_api


async def _listen(runner: web.AppRunner, host: str, port: int) -> None:
    await runner.setup()  # the API app's own startup (its cleanup_ctx) runs here, on the user loop
    await web.TCPSite(runner, host, port).start()
