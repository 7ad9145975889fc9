"""The router's access log: one JSON line per request on the ``modelplex.access`` logger.

Opt-in (``spec.router.accessLog``), except for what changes the deployment or reaches past
``__call__``: model control and method calls are logged always. A line holds the time, the
client (its name where router auth is on, else its address), method, path (no query string: it
may carry an ``access_token``), model, status and duration; never a token.
"""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from modelplex.http import status_of
from modelplex.wire.codec import CALL_CONTENT_TYPE
from modelplex_router.auth import CALLER, MODEL_CONTROL, named_model

log = logging.getLogger("modelplex.access")


def always_logged(request: web.Request) -> bool:
    return bool(MODEL_CONTROL.match(request.path)) or request.content_type == CALL_CONTENT_TYPE


def access_line(request: web.Request, status: int, duration_s: float, now: float) -> str:
    """The JSON line of one request."""
    client = request.get(CALLER) or request.remote or ""
    return orjson.dumps({
        "time": round(now, 3), "client": client, "method": request.method, "path": request.path,
        "model": named_model(request), "status": status, "duration_ms": round(duration_s * 1000, 2),
    }).decode()


def access_log(every_request: bool) -> Middleware:
    """Log each request (or only those :func:`always_logged`) once its answer is known."""

    @web.middleware
    async def log_access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not (every_request or always_logged(request)):
            return await handler(request)
        start, status = time.perf_counter(), 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except BaseException as error:
            status = status_of(error)
            raise
        finally:
            log.info("%s", access_line(request, status, time.perf_counter() - start, time.time()))

    return log_access
