"""Browsers: CORS preflights answered by the router itself, and CORS headers on answers to the
origins ``spec.router.cors.allowOrigins`` names (the Endpoint Picker answers the same through a
Gateway: :func:`preflight_headers`, :func:`answer_cors_headers`).

A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) never reaches a
handler, whatever the config: with the origin allowed it gets 204 and the CORS headers, else 204
with none (the browser then refuses the call). It is answered before authentication, since a
browser sends no credential with it. It allows every request header the README documents, and
answers to an allowed origin expose the response headers a page needs to read: when to retry,
the binary tensor extension's header length, how to authenticate, and which replica answered
where that is shown.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from modelplex.wire.names import DASHED_MODEL_ID_HEADER, MODEL_ID_HEADER
from modelplex.wire.oip import HEADER_LENGTH
from modelplex.wire.spec import Cors
from modelplex_router.cold import ON_COLD_HEADER
from modelplex_router.proxy import REPLICA_HEADER

#: What a browser may send besides the CORS-safelisted headers: the model id (either spelling),
#: a bearer token, a JSON body, an event stream's Last-Event-ID, the request's onCold, and the
#: binary tensor extension's JSON header length (tritonclient's default).
ALLOWED_HEADERS = ", ".join([MODEL_ID_HEADER, DASHED_MODEL_ID_HEADER, "Authorization", "Content-Type", "Last-Event-ID",
                             ON_COLD_HEADER, HEADER_LENGTH])
#: Answer headers a page may read besides the CORS-safelisted ones (the replica's where it is shown).
EXPOSED_HEADERS = (hdrs.RETRY_AFTER, HEADER_LENGTH, hdrs.WWW_AUTHENTICATE)
#: A preflight's answer is cached this long by the browser.
MAX_AGE_S = 600


def is_preflight(request: web.Request) -> bool:
    return (request.method == hdrs.METH_OPTIONS and hdrs.ORIGIN in request.headers
            and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers)


def cors_headers(cors: Cors, origin: str | None) -> dict[str, str]:
    """The CORS headers for an answer to ``origin`` (none when it is not allowed)."""
    if not origin or not cors.allows(origin):
        return {}
    return {hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin, hdrs.VARY: hdrs.ORIGIN}


def preflights(cors: Cors) -> Middleware:
    """Answer preflights here; add CORS headers to every other answer (streams included)."""

    @web.middleware
    async def answer_preflights(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_preflight(request):
            return await handler(request)
        return web.Response(status=204, headers=preflight_headers(cors, request.headers.get(hdrs.ORIGIN)))

    return answer_preflights


def preflight_headers(cors: Cors, origin: str | None) -> dict[str, str]:
    """A preflight's answer headers (204): the CORS ones for an allowed ``origin``, else none."""
    headers = cors_headers(cors, origin)
    if headers:
        headers.update({hdrs.ACCESS_CONTROL_ALLOW_METHODS: "GET, POST, PUT, PATCH, DELETE, OPTIONS",
                        hdrs.ACCESS_CONTROL_ALLOW_HEADERS: ALLOWED_HEADERS,
                        hdrs.ACCESS_CONTROL_MAX_AGE: str(MAX_AGE_S)})
    return headers


def answer_cors_headers(cors: Cors, origin: str | None, replica_shown: bool = False) -> dict[str, str]:
    """An answer's CORS headers for an allowed ``origin``, with the headers a page may read."""
    headers = cors_headers(cors, origin)
    if headers:
        exposed = [*EXPOSED_HEADERS, *([REPLICA_HEADER] if replica_shown else [])]
        headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = ", ".join(exposed)
    return headers


async def add_cors_headers(request: web.Request, response: web.StreamResponse, cors: Cors) -> None:
    """Called as an answer's headers go out (after the replica header was hidden where it is not
    for this caller): the CORS headers for an allowed origin, and the headers a page may read."""
    headers = answer_cors_headers(cors, request.headers.get(hdrs.ORIGIN), REPLICA_HEADER in response.headers)
    for name, value in headers.items():
        response.headers[name] = value
