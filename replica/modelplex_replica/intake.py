"""The replica's intake: a request to ``/v1/invoke`` split into what its client sent and what the
deployment's components said of it.

The router (or a handle) adds internal headers to every request it forwards: the internal
credential, the client's method and raw path, the protocol of the body and the model version
asked for (:mod:`modelplex.wire.internal_headers`). The replica reads them here, once. User
code sees a request's headers in one place only, an ASGI scope (a ``serve.ingress`` app, a
Starlette ``Request``), built from :func:`client_raw_headers`: user code that echoes or logs its
headers can never hand the credential, or anything else components tell each other, to a
client. A plain handler gets the body alone, so its requests are never copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from modelplex.wire.forwarded import METHOD_HEADER, PATH_HEADER
from modelplex.wire.internal_headers import is_internal_header
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


def routed_of(request: web.Request) -> Routed:
    """What the components said of ``request``, read from its internal headers."""
    headers = request.headers
    return Routed(method=headers.get(METHOD_HEADER, request.method), raw_path=headers.get(PATH_HEADER),
                  oip=headers.get(PROTOCOL_HEADER) == PROTOCOL, version=headers.get(VERSION_HEADER) or None)


def client_raw_headers(request: web.Request) -> list[tuple[bytes, bytes]]:
    """``request``'s headers as its client sent them (raw, lower-case names, in order), every
    internal one removed: the only headers user code may see (an ASGI scope's)."""
    return [(name.lower(), value) for name, value in request.raw_headers
            if not is_internal_header(name.decode("latin-1"))]
