"""Who may call the router, and for what: the trust boundary at its door.

- ``/healthz`` and ``/readyz`` are open (probes; ``/metrics`` is on the control port, where it is open too).
- Model control (``/v2/repository/models/{id}/load|unload``, however the id is encoded, and the
  gRPC ``RepositoryModelLoad|Unload``) answers 403 unless ``spec.router.modelControl`` is on,
  whatever credential was sent.
- A method-call envelope (what handles send) needs the deployment's internal credential or a
  listed caller's (``spec.router.callers``); anyone else gets 403, whatever else they sent. The
  deployment's own components may do everything else too; a caller is a named client (its
  deployment's name): its globs and load quota apply, and routing internals are not for it.
- With ``spec.router.auth``: every other request needs ``Authorization: Bearer <token>`` of a
  client (401 with ``WWW-Authenticate`` otherwise), a client may call only the models its globs
  allow (403 naming it and the model, before any load), and routing internals (``/v1/replicas``,
  ``/v1/load``, the replica that answered) are for internal callers only.

Decisions act on the kind of route and the one model id a request is served with
(:mod:`modelplex_router.door`), never on its path: :func:`authorize` decides from plain values,
every front calls it; :func:`access_middleware` applies it to HTTP requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from modelplex.wire.codec import CALL_CONTENT_TYPE
from modelplex.wire.credentials import (ACCESS_TOKEN_PARAM, INTERNAL_TOKEN_HEADER, RESERVED_CLIENT, CallerTokens,
                                        ClientTokens, TokenFile)
from modelplex.wire.errors import Forbidden, Unauthorized
from modelplex.wire.spec import RouterAuth
from modelplex_router.clients import KnownClients
from modelplex_router.door import MODEL_CONTROL, Route, header_models, served_model

#: Paths anyone may read: liveness and readiness (metrics are on the control port).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
#: The caller of a request that passed, for handlers and logs: a client name, or these.
INTERNAL = RESERVED_CLIENT
ANONYMOUS = ""
CALLER = web.RequestKey("caller", str)
#: The model id the request is served with, decided once at the door ("" for none).
SERVED = web.RequestKey("served", str)
#: The kind of route the request takes, decided at the door.
ROUTE = web.RequestKey("route", Route)
#: The HTTP front's handlers by the kind of route each serves (:class:`~modelplex_router.door.Route`).
HANDLER_ROUTES = web.AppKey("handler_routes", Mapping[object, Route])


@dataclass(frozen=True)
class Access:
    """The router's rules: from the spec, the mounted client tokens, the internal credential and
    the credentials of the deployments that may call this one (``callers``)."""

    model_control: bool = False
    auth: RouterAuth | None = None
    #: The bearer tokens' clients: anything with ``client_for(token)`` (in a router,
    #: :class:`~modelplex_router.clients.KnownClients` over the mounted Secret).
    client_tokens: ClientTokens | KnownClients | None = None
    internal: TokenFile | None = None
    callers: CallerTokens | None = None

    @property
    def auth_on(self) -> bool:
        return self.auth is not None


@dataclass(frozen=True)
class Asked:
    """What a request asks for, as far as access goes: its kind of route and the one model id it
    is served with (:mod:`modelplex_router.door`); ``path`` only names it in messages."""

    route: Route
    path: str = ""
    content_type: str = ""
    bearer: str | None = None
    internal_token: str | None = None
    model: str = ""


def authorize(access: Access, asked: Asked) -> str:
    """The caller's name (a client, :data:`INTERNAL` or :data:`ANONYMOUS`); raises
    :class:`Unauthorized` (401) or :class:`Forbidden` (403) when the request may not pass."""
    if asked.route is Route.OPEN:
        return ANONYMOUS
    if asked.route in MODEL_CONTROL and not access.model_control:
        raise Forbidden("model control is off for this deployment (spec.router.modelControl)")
    if access.internal is not None and access.internal.accepts(asked.internal_token):
        return INTERNAL
    caller = access.callers.client_for(asked.internal_token) if access.callers and asked.internal_token else None
    if caller is not None:
        return _client_may(access, caller, asked)
    if asked.content_type == CALL_CONTENT_TYPE:
        raise Forbidden("method calls are for handles of this namespace: external clients reach __call__ "
                        "and ingress routes")
    if access.auth is None:
        return ANONYMOUS
    client = access.client_tokens.client_for(asked.bearer) if access.client_tokens and asked.bearer else None
    if client is None or client == INTERNAL:  # a client named like the components is never one of them
        raise Unauthorized("a valid bearer token is needed (Authorization: Bearer <token>)" if asked.bearer is None
                           else "the bearer token is not valid")
    return _client_may(access, client, asked)


def _client_may(access: Access, client: str, asked: Asked) -> str:
    """``client`` (a bearer token's, or a calling deployment's), or 403: routing internals (with
    auth on) and models outside its globs are not for it."""
    if access.auth_on and asked.route is Route.INTERNALS:
        raise Forbidden(f"{asked.path or 'the routing table'} is for the deployment's own components")
    if asked.model and access.auth is not None and not access.auth.allows(client, asked.model):
        raise Forbidden(f"client {client!r} may not call model {asked.model!r}")
    return client


def may_see(access: Access, caller: str, model: str) -> bool:
    """Whether ``caller`` may see ``model`` in a listing (the repository index): the models its
    globs allow; the deployment's own components, and anyone with auth off, see every model."""
    return access.auth is None or caller == INTERNAL or access.auth.allows(caller, model)


def bearer_token(request: web.Request) -> str | None:
    """The request's bearer token: the ``Authorization`` header, or on a GET the
    ``access_token`` parameter (a browser's EventSource can send no header)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if request.method == "GET":
        return request.query.get(ACCESS_TOKEN_PARAM) or None
    return None


def route_of(request: web.Request) -> Route:
    """The kind of route the request takes: by the handler its route resolved to (on the path as
    aiohttp matches it, ``%2F`` kept: the same that serves it), never by its decoded path."""
    if request.path in OPEN_PATHS:
        return Route.OPEN
    routes = request.app.get(HANDLER_ROUTES)
    return routes.get(request.match_info.handler, Route.SERVER) if routes else Route.SERVER


def served_model_of(request: web.Request, route: Route) -> str:
    """The model id ``request`` is served with: its path's (``{model}``, decoded once by the
    router's route) or its model-id header's; a header that differs from the path is a 400."""
    if route is not Route.MODEL and route not in MODEL_CONTROL:
        return ""
    return served_model(request.match_info.get("model"), header_models(request.headers))


def asked_of(request: web.Request) -> Asked:
    route = route_of(request)
    return Asked(route, path=request.path, content_type=request.content_type, bearer=bearer_token(request),
                 internal_token=request.headers.get(INTERNAL_TOKEN_HEADER), model=served_model_of(request, route))


def access_middleware(access: Access) -> Middleware:
    """Refuse what :func:`authorize` refuses, before the request's body is read or routed."""

    @web.middleware
    async def check_access(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        asked = asked_of(request)
        request[SERVED] = asked.model  # what every later step (quota, log, metrics, the replica) acts on
        request[ROUTE] = asked.route
        request[CALLER] = authorize(access, asked)
        return await handler(request)

    return check_access


def external(request: web.Request, access: Access) -> bool:
    """A request from outside the deployment's own components while auth is on."""
    return access.auth_on and request.get(CALLER) != INTERNAL
