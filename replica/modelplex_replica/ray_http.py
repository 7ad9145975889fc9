"""Ray Serve's HTTP contract for a plain deployment (``spec.http.request: starlette``, which
``serve.run`` and ``modelplex build`` write): ``__call__`` gets a ``starlette.requests.Request``
and may answer with a Starlette response.

The Request is built from what the replica holds already: the client's method, raw path and
query string (passed on by the router), its headers once the internal ones are removed
(:mod:`modelplex_replica.intake`) and the body the replica has read, handed to the Request as
read, never read again. A Starlette response the handler returns is an ASGI app: it is run as a
``serve.ingress`` app is (:class:`~modelplex_replica.asgi.HttpIngress`), so its status, headers,
media type and streamed body reach the client as it sends them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from aiohttp import web

from modelplex.wire.spec import DEFAULT_STREAM_IDLE_TIMEOUT_S
from modelplex_replica.asgi import HttpIngress, asgi_scope, body_receiver
from modelplex_replica.intake import Routed

STARLETTE = "starlette"


def starlette_request(request: web.Request, routed: Routed, body: bytes, root_path: str = "") -> Any:
    """The ``starlette.requests.Request`` of ``request`` (its body already read: ``body``)."""
    from starlette.requests import Request  # a replica dependency; imported where it is used

    # body() and json() never call receive (the body is set below); a raw stream() gets the body
    # once, and is_disconnected() nothing more while the request lasts.
    receive = body_receiver(body, asyncio.Event())
    built = Request(asgi_scope(request, routed, root_path=root_path), receive)
    built._body = body  # Starlette's own cache of a read body: json() and form() read from it
    return built


async def send_response(response: Any, request: web.Request, routed: Routed, instance: Any, model_id: str,
                        loaded_models: Callable[[], str], *,
                        stream_idle_s: float = DEFAULT_STREAM_IDLE_TIMEOUT_S) -> web.StreamResponse:
    """Send the Starlette ``response`` a handler returned, as its ASGI app sends it."""
    return await HttpIngress("/", response, instance).respond(request, routed, model_id, loaded_models,
                                                              stream_idle_s=stream_idle_s)
