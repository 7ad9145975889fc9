"""Only the deployment's own components reach a replica's internal API.

Every route but the probes and metrics (``/healthz``, ``/readyz``, ``/metrics``) needs the
namespace's internal credential in ``X-Modelplex-Internal-Token`` (401 JSON otherwise). A replica
started by hand with no credential configured serves without one only on a loopback address
(:func:`modelplex.serving.check_unguarded_host`).
"""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, TokenFile
from modelplex.wire.errors import Unauthorized

#: Probes and scrapers: open (a NetworkPolicy says who reaches the port).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def internal_only(internal: TokenFile | None) -> Middleware:
    """A middleware that refuses the internal API without ``internal``'s token (None: open,
    for a replica on loopback started by hand)."""

    @web.middleware
    async def check_internal(request: web.Request, handler: Handler) -> web.StreamResponse:
        if internal is not None and request.path not in OPEN_PATHS:
            if not internal.accepts(request.headers.get(INTERNAL_TOKEN_HEADER)):
                raise Unauthorized("the replica's API is for the deployment's routers and handles "
                                   f"({INTERNAL_TOKEN_HEADER} missing or wrong)")
        return await handler(request)

    return check_internal
