"""The router's aiohttp application: routes, and the long-lived resources behind them.

Public API (DESIGN.md, "HTTP"):

- ``POST /`` and ``POST /{path}`` with the ``serve_multiplexed_model_id`` header (Ray Serve's);
- ``POST /v1/models/{model}/predict``; ``POST /v2/models/{model}/infer`` (Open Inference
  Protocol, JSON bodies), with ``GET /v2/health/live`` and ``/v2/health/ready``;
- ``GET /healthz``, ``/readyz`` (a replica is ready), ``/metrics``, ``/v1/replicas``.

The client session and the discovery task live in ``cleanup_ctx``: started with the app,
cancelled and awaited when it stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from modelplex.errors import BadRequest, ModelplexError
from modelplex.http import error_middleware, is_json
from modelplex.ids import InvalidModelId, validate_model_id
from modelplex.names import MODEL_ID_HEADER
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.base import Discovery
from modelplex_router.metrics import CONTENT_TYPE, RouterMetrics
from modelplex_router.proxy import ABORTED, Proxy
from modelplex_router.scheduler import Scheduler
from modelplex_router.table import RoutingTable

log = logging.getLogger("modelplex.router")

CONFIG = web.AppKey("config", RouterConfig)
TABLE = web.AppKey("table", RoutingTable)
SCHEDULER = web.AppKey("scheduler", Scheduler)
METRICS = web.AppKey("metrics", RouterMetrics)
DISCOVERY = web.AppKey("discovery", Discovery)
CLOCK = web.AppKey("clock", Callable[[], float])
SESSION = web.AppKey("session", aiohttp.ClientSession)
PROXY = web.AppKey("proxy", Proxy)


def create_app(config: RouterConfig, discovery: Discovery, *,
               clock: Callable[[], float] = time.monotonic) -> web.Application:
    """A router for one deployment, its replicas found by ``discovery``."""
    app = web.Application(middlewares=[error_middleware], client_max_size=config.max_request_bytes)
    table = RoutingTable(lag_s=discovery.lag_s)
    app[CONFIG] = config
    app[TABLE] = table
    app[CLOCK] = clock
    app[DISCOVERY] = discovery
    app[METRICS] = RouterMetrics(config.deployment, model_label=config.model_label)
    app[SCHEDULER] = Scheduler(
        table,
        config.params,
        policy=config.policy,
        queue_timeout_s=config.queue_timeout_s,
        max_queued=config.max_queued,
        clock=clock,
        deployment=config.deployment,
    )
    app.cleanup_ctx.append(_client_session)
    app.cleanup_ctx.append(_discovery)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/replicas", replicas)
    app.router.add_get("/v2/health/live", healthz)
    app.router.add_get("/v2/health/ready", readyz)
    app.router.add_post("/v1/models/{model}/predict", predict)
    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_post("/", invoke)
    app.router.add_post("/{tail:.*}", invoke)
    return app


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    # One session for every proxied request: pooled keep-alive connections, no limit on
    # their number (maxOngoingRequests bounds them), bodies passed through still encoded.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s),
        skip_auto_headers=("User-Agent",),
        # A proxy keeps no cookies: one client's Set-Cookie must never reach another client.
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    app[SESSION] = session
    app[PROXY] = Proxy(app[SCHEDULER], session, app[METRICS],
                       first_byte_timeout_s=config.first_byte_timeout_s, clock=app[CLOCK])
    try:
        yield
    finally:
        await session.close()


async def _discovery(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[DISCOVERY].run(app[TABLE], app[CLOCK]), name="discovery")
    task.add_done_callback(_report_crash)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("discovery stopped: %r", task.exception(), exc_info=task.exception())


# -- inference -------------------------------------------------------------------------------


async def invoke(request: web.Request) -> web.StreamResponse:
    """``POST /`` (or any path) for the model named by the ``serve_multiplexed_model_id`` header."""
    return await _serve(request, request.headers.get(MODEL_ID_HEADER, ""), oip=False)


async def predict(request: web.Request) -> web.StreamResponse:
    """``POST /v1/models/{model}/predict``: the model named in the path."""
    return await _serve(request, request.match_info["model"], oip=False)


async def infer(request: web.Request) -> web.StreamResponse:
    """``POST /v2/models/{model}/infer`` (Open Inference Protocol); JSON bodies only."""
    return await _serve(request, request.match_info["model"], oip=True)


async def _serve(request: web.Request, model: str, *, oip: bool) -> web.StreamResponse:
    app = request.app
    metrics = app[METRICS]
    start = time.perf_counter()
    metrics.inflight.inc()
    status = 500
    label = model  # the metrics' model label: never an unchecked string
    try:
        if model:
            try:
                validate_model_id(model)
            except InvalidModelId as error:
                label = ""
                raise BadRequest(str(error)) from None
        body = await request.read()
        if oip:
            _check_oip(request, body)
        response = await app[PROXY].forward(request, model, body)
        status = response.get(ABORTED, response.status)
        return response
    except ModelplexError as error:
        status = error.status
        raise
    except web.HTTPException as error:  # 413 from read(), mostly
        status = error.status
        raise
    except asyncio.CancelledError:  # the client hung up (or the router is stopping)
        status = 499
        raise
    finally:
        metrics.inflight.dec()
        metrics.observe(status, time.perf_counter() - start, label)


def _check_oip(request: web.Request, body: bytes) -> None:
    if not is_json(request.content_type):
        raise BadRequest(f"/v2/models/*/infer takes application/json (got {request.content_type!r})")
    try:
        document = json.loads(body)
    except ValueError as error:
        raise BadRequest(f"the body is not valid JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("inputs"), list):
        raise BadRequest('an inference request is a JSON object with an "inputs" list')


# -- operations ------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready while at least one replica is: a router with none can only answer 503."""
    app = request.app
    ready = len(app[TABLE].usable(app[CLOCK]()))
    body = {"ready": ready > 0, "replicas": len(app[TABLE]), "ready_replicas": ready}
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def replicas(request: web.Request) -> web.Response:
    """The routing table, for people and tests."""
    app = request.app
    return web.json_response({
        "deployment": app[CONFIG].deployment,
        "policy": app[SCHEDULER].policy_name,
        "queued": app[SCHEDULER].queued,
        "replicas": app[TABLE].snapshot(),
    })
