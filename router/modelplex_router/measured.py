"""The one wrapper every request the router answers for a model goes through: its model id
checked (400) and its outcome counted in the router's metrics (in flight, status, latency)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from aiohttp import web

from modelplex.wire.errors import BadRequest, ModelplexError
from modelplex.wire.ids import InvalidModelId, validate_model_id
from modelplex_router.keys import METRICS
from modelplex_router.proxy import ABORTED


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
    metrics = request.app[METRICS]
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
