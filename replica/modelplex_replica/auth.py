"""Only the deployment's own components reach a replica's internal API.

Every route but the probes and metrics (``/healthz``, ``/readyz``, ``/metrics``) needs the
deployment's internal credential in ``X-Modelplex-Internal-Token`` (401 JSON otherwise). Behind a
Gateway, a request the router's Endpoint Picker admitted carries a proof instead
(:mod:`modelplex.wire.proof`): accepted for one model's inference (``POST /v1/invoke`` with that
model's id) or metadata, on the replica address it names, until it expires; nothing else (loads,
unloads, pins, listings) is open to it. The proof is an internal header: the replica's intake
removes it before user code. A replica started by hand with no credential configured serves
without one only on a loopback address (:func:`modelplex.serving.check_unguarded_host`).
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web
from aiohttp.typedefs import Middleware

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, DeploymentCredential, TokenFile
from modelplex.wire.errors import Unauthorized
from modelplex.wire.loaded import LOADED_MODELS_PATH
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.proof import PROOF_HEADER, check_proof, endpoint

#: Probes and scrapers: open (a NetworkPolicy says who reaches the port).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def internal_only(internal: TokenFile | None, *, clock: Callable[[], float] = time.time) -> Middleware:
    """A middleware that refuses the internal API without ``internal``'s token or a picker's
    proof for the request (None: open, for a replica on loopback started by hand); ``clock``:
    wall-clock seconds, for the proofs' expiry."""

    @web.middleware
    async def check_internal(request: web.Request, handler: Handler) -> web.StreamResponse:
        if internal is not None and request.path not in OPEN_PATHS:
            if not internal.accepts(request.headers.get(INTERNAL_TOKEN_HEADER)) and not proven(request, internal,
                                                                                                clock()):
                raise Unauthorized("the replica's API is for the deployment's routers, handles and its Endpoint "
                                   f"Picker's Gateway ({INTERNAL_TOKEN_HEADER} or {PROOF_HEADER} missing or wrong)")
        return await handler(request)

    return check_internal


def proven(request: web.Request, internal: TokenFile, now: float) -> bool:
    """Whether the request carries a picker's proof for what it asks, on this replica's address."""
    proof = request.headers.get(PROOF_HEADER)
    if proof is None:
        return False
    model = proof_model(request)
    local = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if model is None or not local:
        return False
    return check_proof(signing_tokens(internal), proof, model, endpoint(local[0], local[1]), now)


def proof_model(request: web.Request) -> str | None:
    """The one model a proof may admit this request for: an inference's model-id header, or the
    model whose metadata it reads; None for every other route (a proof opens nothing else)."""
    if request.method == "POST" and request.path == "/v1/invoke":
        return request.headers.get(MODEL_ID_HEADER, "")
    prefix = LOADED_MODELS_PATH + "/"
    if request.method == "GET" and request.path.startswith(prefix) and request.path.endswith("/metadata"):
        encoded = request.raw_path.partition("?")[0][len(prefix):-len("/metadata")]
        return unquote(encoded) if encoded and "/" not in encoded else None
    return None


def signing_tokens(internal: TokenFile) -> tuple[str, ...]:
    """The credentials a proof may be signed with: what the deployment's components send now
    (the namespace's token during an upgrade from it) and the deployment's own."""
    tokens = [internal.token()]
    if isinstance(internal, DeploymentCredential):
        tokens.append(internal.own())
    return tuple(dict.fromkeys(token for token in tokens if token))
