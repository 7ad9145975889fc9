"""The replica's intake: a request to ``/v1/invoke`` split into what its client sent and what the
deployment's components said of it.

The router (or a handle) adds internal headers to every request it forwards: the internal
credential, the client's method and raw path, the protocol of the body and the model version
asked for (:mod:`modelplex.wire.internal_headers`). The replica reads them here, once, and
everything after (the handler, a ``serve.ingress`` app and its ASGI scope, a Starlette
``Request``) gets the request without them: user code that echoes or logs its headers can
never hand the credential, or anything else components tell each other, to a client.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from modelplex.wire.forwarded import METHOD_HEADER, PATH_HEADER
from modelplex.wire.internal_headers import client_headers, is_internal_header
from modelplex.wire.oip import PROTOCOL, PROTOCOL_HEADER, VERSION_HEADER


@dataclass(frozen=True)
class Routed:
    """What the deployment's components said of a request, read from its internal headers."""

    #: The client's method (the request's own where the router sent none).
    method: str
    #: The client's raw path and query string; None for a request that did not come through the
    #: router's catch-all route (``/v1/models/{m}/predict``, a handle's call): no path to check.
    raw_path: str | None = None
    #: The body is an Open Inference Protocol inference request.
    oip: bool = False
    #: The OIP model version asked for (``/versions/V``), if any.
    version: str | None = None


def without_internal_headers(request: web.Request) -> tuple[web.Request, Routed]:
    """``request`` as its client sent it (every internal header removed: the only request user
    code may see) and what the components said of it. Call it before the body is read: aiohttp
    clones a request only while its body is unread."""
    headers = request.headers
    routed = Routed(method=headers.get(METHOD_HEADER, request.method), raw_path=headers.get(PATH_HEADER),
                    oip=headers.get(PROTOCOL_HEADER) == PROTOCOL, version=headers.get(VERSION_HEADER) or None)
    if not any(is_internal_header(name) for name in headers):
        return request, routed
    return request.clone(headers=client_headers(headers.items())), routed
