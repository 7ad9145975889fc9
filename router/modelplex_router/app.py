"""The router's aiohttp application: routes, and the long-lived resources behind them.

Public API (README, "Router API"; the OpenAPI document at ``/openapi.json``):

- any method on ``/`` and every path under it (Ray Serve's route prefix), for the model named
  by the ``serve_multiplexed_model_id`` header (or its dashed spelling, which proxies keep);
- ``POST /v1/models/{model}/predict``;
- the Open Inference Protocol v2 under ``/v2`` (:mod:`modelplex_router.oip`);
- ``GET /healthz``, ``/readyz`` (a replica is ready), ``/metrics``, ``/v1/replicas``, ``/openapi.json``;
- ``GET /v1/load``: the load report the autoscaler reads (:mod:`modelplex_router.load`).

The router's own paths are not the handler's: a wrong method there is a 405 with ``Allow``,
an unknown path under ``/v2`` a 404.

The client session and the discovery task live in ``cleanup_ctx``: started with the app,
cancelled and awaited when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from modelplex.autoscaling import LOAD_PATH
from modelplex.wire.credentials import ClientTokens, TokenFile
from modelplex.wire.forwarded import forwarded_headers
from modelplex.http import error_middleware, internal_session, read_body
from modelplex.wire.names import DASHED_MODEL_ID_HEADER, MODEL_ID_HEADER
from modelplex_router import load, oip
from modelplex_router.access_log import access_log
from modelplex_router.auth import Access, access_middleware, external
from modelplex_router.browsers import add_cors_headers, preflights
from modelplex_router.cold import ColdGate
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.base import Discovery
from modelplex_router.discovery.documents import DocumentFetcher
from modelplex_router.keys import CLOCK, COLD, CONFIG, DISCOVERY, DRAINING, METRICS, PROXY, SCHEDULER, SESSION, TABLE
from modelplex_router.measured import measured
from modelplex_router.metrics import CONTENT_TYPE, RouterMetrics
from modelplex_router.openapi import openapi_document
from modelplex_router.pins import Pinner
from modelplex_router.proxy import FORWARDED_REQUEST_HEADERS, REPLICA_HEADER, Proxy, Reply
from modelplex_router.quota import LoadQuotas
from modelplex_router.scheduler import Scheduler

log = logging.getLogger("modelplex.router")

ACCESS = web.AppKey("access", Access)
PINNER = web.AppKey("pinner", Pinner)

#: The router's own paths; everything else (any method) is the handler's.
RESERVED = r"(?!(?:healthz|readyz|metrics|openapi\.json|v1/replicas|v1/load|v2)(?:/|$)|v1/models/[^/]+/predict$)"


def create_app(config: RouterConfig, discovery: Discovery, *,
               clock: Callable[[], float] = time.monotonic) -> web.Application:
    """A router for one deployment, its replicas found by ``discovery``."""
    access = access_of(config)
    # In this order: a CORS preflight is answered before authentication, which comes before the body
    # is read (within the body timeout, by the handlers).
    app = web.Application(middlewares=[error_middleware, preflights(config.cors), access_log(config.access_log),
                                       oip.protocol_errors, access_middleware(access)],
                          client_max_size=config.max_request_bytes)
    app[ACCESS] = access
    app[CONFIG] = config
    app[CLOCK] = clock
    app[DISCOVERY] = discovery
    app[DRAINING] = asyncio.Event()
    app[METRICS] = RouterMetrics(config.deployment, model_label=config.model_label)
    app[SCHEDULER] = scheduler = Scheduler(
        config.params,
        lag_s=discovery.lag_s,
        policy=config.policy,
        queue_timeout_s=config.queue_timeout_s,
        max_queued=config.max_queued,
        clock=clock,
        deployment=config.deployment,
        hold_at_zero_s=config.hold_at_zero_s,
        weight=config.models.weight,
        fair=config.queue_order == "fair",
    )
    # The scheduler's table: discovery, the document fetcher and the proxy tell it what they see.
    app[TABLE] = scheduler.table
    app[METRICS].queued.set_function(lambda: scheduler.queued)
    app[METRICS].watch_queues(scheduler.waiting)
    app.cleanup_ctx.append(_client_session)
    app.cleanup_ctx.append(_discovery)
    if config.pinned:
        app.cleanup_ctx.append(_pinner)
    routes = app.router
    routes.add_get("/healthz", healthz)
    routes.add_get("/readyz", readyz)
    routes.add_get("/metrics", metrics)
    routes.add_get("/openapi.json", openapi)
    routes.add_get("/v1/replicas", replicas)
    routes.add_get(LOAD_PATH, load.load)
    routes.add_post("/v1/models/{model}/predict", predict)
    # For clients that cannot send headers (a browser's EventSource): the model in the path.
    routes.add_get("/v1/models/{model}/predict", predict)
    oip.add_routes(routes, ready=readyz)
    routes.add_route("*", "/{tail:" + RESERVED + ".*}", invoke)
    app.on_response_prepare.append(_hide_routing)
    if config.cors.allow_origins:
        app.on_response_prepare.append(lambda request, response: add_cors_headers(request, response, config.cors))
    return app


def access_of(config: RouterConfig) -> Access:
    """Who may call this router (:mod:`modelplex_router.auth`), from its config."""
    if config.auth is not None and config.client_tokens_dir is None:
        log.warning("spec.router.auth is set but no client tokens are mounted: every request gets 401")
    return Access(
        model_control=config.model_control,
        auth=config.auth,
        client_tokens=ClientTokens(Path(config.client_tokens_dir)) if config.client_tokens_dir else None,
        internal=TokenFile(Path(config.internal_token_file)) if config.internal_token_file else None,
    )


async def _hide_routing(request: web.Request, response: web.StreamResponse) -> None:
    """Which replica answered is routing detail: not for external clients where auth is on."""
    if external(request, request.app[ACCESS]):
        response.headers.popall(REPLICA_HEADER, None)


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    # One session for every proxied request: pooled keep-alive connections, no limit on
    # their number (maxOngoingRequests bounds them), bodies passed through still encoded.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    session = internal_session(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s),
        skip_auto_headers=("User-Agent",),
        # A proxy keeps no cookies: one client's Set-Cookie must never reach another client.
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    app[SESSION] = session
    app[PROXY] = proxy = Proxy(app[SCHEDULER], session, app[METRICS],
                                first_byte_timeout_s=config.first_byte_timeout_s, clock=app[CLOCK])
    quota = config.load_quota
    app[COLD] = cold = ColdGate(
        app[TABLE], config.models, app[METRICS], clock=app[CLOCK],
        load=lambda model: proxy.exchange(model, b"", {}, _loaded, path=oip.load_path(model)),
        quotas=LoadQuotas(quota.loads_per_minute, quota.burst, clock=app[CLOCK]) if quota else None,
    )
    try:
        yield
    finally:
        await cold.close()
        await session.close()


async def _loaded(reply: Reply) -> None:
    """A background load's answer: a failure is logged by the gate."""
    if reply.status >= 400:
        raise RuntimeError(f"replica {reply.replica} answered {reply.status}")


async def _discovery(app: web.Application) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(app[DISCOVERY].run(app[TABLE], app[CLOCK]), name="discovery"),
             asyncio.create_task(DocumentFetcher().run(app[TABLE], app[CLOCK]), name="document fetcher")]
    for task in tasks:
        task.add_done_callback(_report_crash)
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pinner(app: web.Application) -> AsyncIterator[None]:
    """Keep ``spec.models`` ``minCopies`` placed and leased on the replicas (:mod:`modelplex_router.pins`)."""
    app[PINNER] = pinner = Pinner(app[CONFIG].pinned, app[TABLE], lambda: app[SESSION], app[CLOCK])
    app[METRICS].pinned_placed.set_function(lambda: sum(len(m) for m in pinner.placement.replicas.values()))
    app[METRICS].pinned_missing.set_function(lambda: sum(pinner.placement.missing.values()))
    task = asyncio.create_task(pinner.run(), name="pinner")
    task.add_done_callback(_report_crash)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r", task.get_name(), task.exception(), exc_info=task.exception())


# -- inference -------------------------------------------------------------------------------


def model_id_header(request: web.Request) -> str:
    return request.headers.get(MODEL_ID_HEADER) or request.headers.get(DASHED_MODEL_ID_HEADER) or ""


async def invoke(request: web.Request) -> web.StreamResponse:
    """Any method on ``/`` or a path under it, for the model named by the model id header.

    As in Ray Serve, a GET (a browser, ``EventSource``, Ray's docs' ``requests.get``) reaches
    the handler too, with an empty body."""
    model = model_id_header(request)
    # The method, path and headers as sent: for a replica's serve.ingress app and route prefix.
    sent = forwarded_headers(request.method, request.raw_path, request.headers.items(), FORWARDED_REQUEST_HEADERS)
    return await measured(request, model, lambda: _forward(request, model, sent))


async def predict(request: web.Request) -> web.StreamResponse:
    """``POST`` (or ``GET``) ``/v1/models/{model}/predict``: the model named in the path; the
    method, path and query string reach the handler as sent."""
    model = request.match_info["model"]
    sent = forwarded_headers(request.method, request.raw_path, request.headers.items(), FORWARDED_REQUEST_HEADERS)
    return await measured(request, model, lambda: _forward(request, model, sent))


async def _forward(request: web.Request, model: str, headers: dict[str, str] | None = None) -> web.StreamResponse:
    request.app[COLD].admit_request(request, model)
    body = await read_body(request, request.app[CONFIG].body_timeout_s)
    return await request.app[PROXY].forward(request, model, body, headers=headers)


# -- operations ------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready while at least one replica is: a router with none can only answer 503. An
    autoscaled deployment's router is ready at zero replicas too: it holds the request that
    makes the autoscaler start one, so it must stay in its Service."""
    body = readiness(request.app)
    return web.json_response(body, status=200 if body["ready"] else 503)


def readiness(app: web.Application) -> dict:
    """``/readyz``'s answer (the gRPC ``ServerReady`` and health service say the same)."""
    ready = len(app[TABLE].usable(app[CLOCK]()))
    holds = app[CONFIG].hold_at_zero_s is not None
    body = {"ready": ready > 0 or holds, "replicas": len(app[TABLE]), "ready_replicas": ready}
    if app[DRAINING].is_set():
        body["ready"] = False
        body["draining"] = True
    return body


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3 document of this API."""
    return web.json_response(openapi_document(request.app))


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
        # Where this router placed the pinned copies (spec.models minCopies), and what does not fit.
        "pins": ({"placement": {n: list(m) for n, m in app[PINNER].placement.replicas.items() if m},
                  "missing": app[PINNER].placement.missing} if PINNER in app else None),
    })
