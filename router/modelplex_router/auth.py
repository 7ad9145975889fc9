"""Who may call the router, and for what: the trust boundary at its door.

- ``/healthz``, ``/readyz`` and ``/metrics`` are open (probes and scrapers).
- Model control (``/v2/repository/models/{id}/load|unload``) answers 403 unless
  ``spec.router.modelControl`` is on, whatever credential was sent.
- A method-call envelope (what handles send) needs the namespace's internal credential; anyone
  else gets 403, whatever else they sent. A caller with it may do everything else too.
- With ``spec.router.auth``: every other request needs ``Authorization: Bearer <token>`` of a
  client (401 with ``WWW-Authenticate`` otherwise), a client may call only the models its globs
  allow (403 naming it and the model, before any load), and routing internals (``/v1/replicas``,
  ``/v1/load``, the replica that answered) are for internal callers only.

:func:`authorize` decides from plain values; :func:`access_middleware` applies it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from modelplex.http import model_id_of
from modelplex.wire.codec import CALL_CONTENT_TYPE
from modelplex.wire.credentials import ACCESS_TOKEN_PARAM, INTERNAL_TOKEN_HEADER, ClientTokens, TokenFile
from modelplex.wire.errors import Forbidden, Unauthorized
from modelplex.wire.load import LOAD_PATH
from modelplex.wire.spec import RouterAuth

#: Paths anyone may read: liveness, readiness, metrics.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})
#: The routing table and load report: people and tests read them where auth is off.
ROUTING_INTERNALS = frozenset({"/v1/replicas", LOAD_PATH})
MODEL_CONTROL = re.compile(r"^/v2/repository/models/[^/]+/(?:load|unload)$")
#: The caller of a request that passed, for handlers and logs: a client name, or these.
INTERNAL = "internal"
ANONYMOUS = ""
CALLER = web.RequestKey("caller", str)


@dataclass(frozen=True)
class Access:
    """The router's rules: from the spec, the mounted client tokens and the internal credential."""

    model_control: bool = False
    auth: RouterAuth | None = None
    client_tokens: ClientTokens | None = None
    internal: TokenFile | None = None

    @property
    def auth_on(self) -> bool:
        return self.auth is not None


@dataclass(frozen=True)
class Asked:
    """What a request asks for, as far as access goes."""

    path: str
    content_type: str = ""
    bearer: str | None = None
    internal_token: str | None = None
    model: str = ""


def authorize(access: Access, asked: Asked) -> str:
    """The caller's name (a client, :data:`INTERNAL` or :data:`ANONYMOUS`); raises
    :class:`Unauthorized` (401) or :class:`Forbidden` (403) when the request may not pass."""
    if asked.path in OPEN_PATHS:
        return ANONYMOUS
    if MODEL_CONTROL.match(asked.path) and not access.model_control:
        raise Forbidden("model control is off for this deployment (spec.router.modelControl)")
    if access.internal is not None and access.internal.accepts(asked.internal_token):
        return INTERNAL
    if asked.content_type == CALL_CONTENT_TYPE:
        raise Forbidden("method calls are for handles of this namespace: external clients reach __call__ "
                        "and ingress routes")
    if access.auth is None:
        return ANONYMOUS
    client = access.client_tokens.client_for(asked.bearer) if access.client_tokens and asked.bearer else None
    if client is None:
        raise Unauthorized("a valid bearer token is needed (Authorization: Bearer <token>)" if asked.bearer is None
                           else "the bearer token is not valid")
    if asked.path in ROUTING_INTERNALS:
        raise Forbidden(f"{asked.path} is for the deployment's own components")
    if asked.model and not access.auth.allows(client, asked.model):
        raise Forbidden(f"client {client!r} may not call model {asked.model!r}")
    return client


def bearer_token(request: web.Request) -> str | None:
    """The request's bearer token: the ``Authorization`` header, or on a GET the
    ``access_token`` parameter (a browser's EventSource can send no header)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if request.method == "GET":
        return request.query.get(ACCESS_TOKEN_PARAM) or None
    return None


def named_model(request: web.Request) -> str:
    """The model a request names: in its path (``{model}``) or its model-id header."""
    return request.match_info.get("model") or model_id_of(request.headers)


def asked_of(request: web.Request) -> Asked:
    return Asked(path=request.path, content_type=request.content_type, bearer=bearer_token(request),
                 internal_token=request.headers.get(INTERNAL_TOKEN_HEADER), model=named_model(request))


def access_middleware(access: Access) -> Middleware:
    """Refuse what :func:`authorize` refuses, before the request's body is read or routed."""

    @web.middleware
    async def check_access(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        request[CALLER] = authorize(access, asked_of(request))
        return await handler(request)

    return check_access


def external(request: web.Request, access: Access) -> bool:
    """A request from outside the deployment's own components while auth is on."""
    return access.auth_on and request.get(CALLER) != INTERNAL
