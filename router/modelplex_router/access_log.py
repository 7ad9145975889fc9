"""The router's access log: one JSON line per request on the ``modelplex.access`` logger.

Opt-in (``spec.router.accessLog``), except for what changes the deployment or reaches past
``__call__``: model control (every attempt, refused or not, on every front: the gRPC front
writes the same line through :func:`line`) and method calls are logged always. A line holds the
time, the client (its name where router auth is on, else its address), method, path (no query
string: it may carry an ``access_token``), the model the request is served with, status and
duration; never a token.
"""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from modelplex.http import status_of
from modelplex.wire.codec import CALL_CONTENT_TYPE
from modelplex_router.auth import CALLER, SERVED, route_of
from modelplex_router.door import MODEL_CONTROL
from modelplex_router.proxy import ABORTED

log = logging.getLogger("modelplex.access")


def always_logged(request: web.Request) -> bool:
    """Model control (by the route that serves the request, so ``%2F`` in an id changes nothing)
    and method calls."""
    return route_of(request) in MODEL_CONTROL or request.content_type == CALL_CONTENT_TYPE


def line(client: str, method: str, path: str, model: str, status: int, duration_s: float, now: float) -> str:
    """The JSON line of one request, whatever its front (``path``: without a query string)."""
    return orjson.dumps({
        "time": round(now, 3), "client": client, "method": method, "path": path,
        "model": model, "status": status, "duration_ms": round(duration_s * 1000, 2),
    }).decode()


def access_line(request: web.Request, status: int, duration_s: float, now: float) -> str:
    """The JSON line of one HTTP request: its model is the one it is served with (none when it
    was refused before that was known)."""
    client = request.get(CALLER) or request.remote or ""
    return line(client, request.method, request.path, request.get(SERVED, ""), status, duration_s, now)


def access_log(every_request: bool) -> Middleware:
    """Log each request (or only those :func:`always_logged`) once its answer is known."""

    @web.middleware
    async def log_access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not (every_request or always_logged(request)):
            return await handler(request)
        start, status = time.perf_counter(), 500
        try:
            response = await handler(request)
            # A stream cut part way is logged as what it was (499: the client left or stopped
            # reading; 502: the replica failed), as the metrics count it, not as its status line.
            status = response.get(ABORTED, response.status)
            return response
        except BaseException as error:
            status = status_of(error)
            raise
        finally:
            log.info("%s", access_line(request, status, time.perf_counter() - start, time.time()))

    return log_access
