"""The one wrapper every request the router answers for a model goes through: its model id
checked (400) and its outcome counted in the router's metrics (in flight, status, latency);
and the HTTP front's way to the gate every route that can load a model passes (:func:`admit`)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

from aiohttp import web

from modelplex.wire.errors import BadRequest, ModelplexError
from modelplex.wire.ids import checked_model_id
from modelplex_router.auth import CALLER, ROUTE, SERVED
from modelplex_router.cold import ON_COLD_HEADER, quota_client
from modelplex_router.keys import ROUTER
from modelplex_router.metrics import RouterMetrics
from modelplex_router.proxy import ABORTED

T = TypeVar("T")


def admit(request: web.Request) -> None:
    """``onCold`` and the load quota (:meth:`~modelplex_router.router.Router.admit`) for an HTTP
    request, on the route and model decided at the door; call it before the body is read, so
    that a refused request holds nothing."""
    client = quota_client(request.get(CALLER, ""), request.remote)
    request.app[ROUTER].admit(request[ROUTE], request[SERVED], client, request.headers.get(ON_COLD_HEADER))


async def measured(request: web.Request, model: str,
                   answer: Callable[[], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Run ``answer()`` counted in the router's metrics: in flight, status and latency."""
    return await counted(request.app[ROUTER].metrics, model, answer, protocol="http",
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
    except (asyncio.CancelledError, ConnectionResetError):  # the client hung up or stopped reading (StreamIdle)
        status = 499
        raise
    finally:
        metrics.inflight.dec()
        metrics.observe(status, time.perf_counter() - start, label, protocol=protocol)
