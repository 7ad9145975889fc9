"""The router app's typed keys, and the one wrapper every proxied request goes through."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

import aiohttp
from aiohttp import web

from modelplex.wire.errors import BadRequest, ModelplexError
from modelplex.wire.ids import InvalidModelId, validate_model_id
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.base import Discovery
from modelplex_router.metrics import RouterMetrics
from modelplex_router.proxy import ABORTED, Proxy
from modelplex_router.scheduler import Scheduler
from modelplex_router.table import RoutingTable

T = TypeVar("T")

CONFIG = web.AppKey("config", RouterConfig)
TABLE = web.AppKey("table", RoutingTable)
SCHEDULER = web.AppKey("scheduler", Scheduler)
METRICS = web.AppKey("metrics", RouterMetrics)
DISCOVERY = web.AppKey("discovery", Discovery)
CLOCK = web.AppKey("clock", Callable[[], float])
SESSION = web.AppKey("session", aiohttp.ClientSession)
PROXY = web.AppKey("proxy", Proxy)
#: Set on SIGTERM: /readyz answers 503 while the requests in flight finish.
DRAINING = web.AppKey("draining", asyncio.Event)


def checked_model_id(model: str) -> str:
    """``model`` if it is a valid id (400 otherwise); "" stays "" (no model named)."""
    if model:
        try:
            validate_model_id(model)
        except InvalidModelId as error:
            raise BadRequest(str(error)) from None
    return model


async def measured(request: web.Request, model: str,
                   answer: Callable[[], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Run ``answer()`` counted in the router's metrics: in flight, status and latency."""
    return await counted(request.app[METRICS], model, answer, protocol="http",
                         status_of=lambda response: response.get(ABORTED, response.status))


async def counted(metrics: RouterMetrics, model: str, answer: Callable[[], Awaitable[T]], *, protocol: str,
                  status_of: Callable[[T], int]) -> T:
    """Run ``answer()`` counted in ``metrics`` under ``protocol``: in flight, status (what
    ``status_of`` says of its answer, or the error's) and latency."""
    start = time.perf_counter()
    metrics.inflight.inc()
    status = 500
    label = model  # the metrics' model label: never an unchecked string
    try:
        try:
            checked_model_id(model)
        except BadRequest:
            label = ""
            raise
        response = await answer()
        status = status_of(response)
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
        metrics.observe(status, time.perf_counter() - start, label, protocol=protocol)
