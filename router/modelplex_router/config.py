"""The router's settings: from the deployment's spec, plus a few environment overrides."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from modelplex.wire.credentials import (ENV_CALLER_TOKENS_DIR, ENV_CLIENT_TOKENS_DIR, ENV_INTERNAL_TOKEN_FILE,
                                        ENV_LEGACY_TOKEN_FILE, ENV_RUN_TOKEN_FILE)
from modelplex.wire.load import DEFAULT_HOLD_AT_ZERO_S
from modelplex.wire.spec import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, DEFAULT_LOAD_TIMEOUT_S,
                                 DEFAULT_MAX_REQUEST_BYTES, DEFAULT_NOT_FOUND_CACHE_S, DEFAULT_STREAM_IDLE_TIMEOUT_S,
                                 REQUEST_TIMEOUT_MARGIN_S, Cors, Deployment, LoadQuota, RouterAuth)
from modelplex_router.fairness import ORDERS
from modelplex_router.policy import POLICIES, Params
from modelplex_router.rules import ModelRules

# Not MODELPLEX_ROUTER_*: local mode exports MODELPLEX_ROUTER_<DEPLOYMENT> for every
# deployment, and a deployment may well be called "policy".
ENV_POLICY = "MODELPLEX_ROUTING_POLICY"
ENV_QUEUE_TIMEOUT = "MODELPLEX_ROUTING_QUEUE_TIMEOUT_S"
ENV_POLL_INTERVAL = "MODELPLEX_ROUTING_POLL_INTERVAL_S"
ENV_HOLD_AT_ZERO = "MODELPLEX_ROUTING_HOLD_AT_ZERO_S"
#: ``fair`` (weighted fair order between models, the default) or ``fifo`` (first come, first served).
ENV_QUEUE_ORDER = "MODELPLEX_ROUTING_QUEUE_ORDER"
# The router's own knobs (environment, not spec): their defaults, written once. The spec's
# defaults come from modelplex.wire.spec.
DEFAULT_POLICY = "cache-aware"
DEFAULT_QUEUE_TIMEOUT_S = 10.0
DEFAULT_POLL_INTERVAL_S = 0.15


def idle_keep_s(replica_idle_timeout_s: float) -> float:
    """How long the router keeps an idle connection to a replica: half the replicas' own idle
    timeout (``spec.router.idleTimeoutSeconds``, which they keep too), at most 30 s, so that a
    replica never closes a connection just as the router sends on it."""
    return min(30.0, replica_idle_timeout_s / 2)


@dataclass(frozen=True)
class RouterConfig:
    """Everything the router app needs to know besides where the replicas are."""

    deployment: str
    params: Params
    policy: str = DEFAULT_POLICY
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    model_label: bool = False
    #: How long a request may wait for a replica slot before a 503 with Retry-After.
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    #: How many requests for one model may wait for a slot at once before new ones for that
    #: model get a 503 at once (per model: one model's flood is refused for itself only).
    max_queued: int = 1000
    #: ``spec.router.maxQueuedRequests`` (Ray's ``max_queued_requests``): requests waiting for
    #: this deployment, all models together, before new ones get a 503 at once; None: no such bound.
    max_queued_requests: int | None = None
    #: The order in which models' waiting requests get slots: "fair" (by ``spec.models``
    #: weights) or "fifo" (first come, first served; for comparisons).
    queue_order: str = "fair"
    #: ``spec.models``: weights, cold-load policy, spread bounds per model id.
    models: ModelRules = ModelRules()
    #: ``spec.router.loadQuota``: cold loads per client.
    load_quota: LoadQuota | None = None
    #: An autoscaled deployment's bound for a request that finds no replica ready (it may be at
    #: zero on purpose, a replica starting for it); None: ``queue_timeout_s``.
    hold_at_zero_s: float | None = None
    #: Until the first byte of the answer (a model load included) before a 504:
    #: ``spec.router.requestTimeoutSeconds``.
    first_byte_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S + REQUEST_TIMEOUT_MARGIN_S
    connect_timeout_s: float = 5.0
    #: How long an idle connection to a replica is kept (:func:`idle_keep_s`).
    upstream_idle_s: float = idle_keep_s(DEFAULT_IDLE_TIMEOUT_S)
    #: Static discovery: how often each replica's /v1/models and /readyz are read.
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    #: ``spec.router.modelControl``: load and unload through the router.
    model_control: bool = False
    #: ``spec.router.bodyTimeoutSeconds``: a body not in by then is a 408.
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    #: ``spec.router.streamIdleTimeoutSeconds``: a stream whose client read nothing this long is cut.
    stream_idle_timeout_s: float = DEFAULT_STREAM_IDLE_TIMEOUT_S
    #: ``spec.multiplexing.notFoundCacheSeconds``: how long a model id a replica did not find is
    #: answered 404 by the cold gate (``onCold: reject``) without asking a replica again.
    not_found_s: float = DEFAULT_NOT_FOUND_CACHE_S
    #: ``spec.router.cors.allowOrigins`` and ``spec.router.accessLog``.
    cors: Cors = Cors()
    access_log: bool = False
    #: ``spec.router.auth``: client tokens and the models each client may call.
    auth: RouterAuth | None = None
    #: ``spec.router.forwardCredentials``: the bearer token the router read reaches the handler too.
    forward_credentials: bool = False
    #: The client tokens (a mounted Secret: one file per client) and the internal credential.
    client_tokens_dir: str | None = None
    internal_token_file: str | None = None
    #: The namespace's token while the deployment upgrades from it; local mode's run credential.
    legacy_token_file: str | None = None
    run_token_file: str | None = None
    #: ``spec.router.callers`` (and the application's other deployments): their credentials, a
    #: folder with one file per calling deployment (:class:`~modelplex.wire.credentials.CallerTokens`).
    caller_tokens_dir: str | None = None
    #: ``spec.models`` entries with ``minCopies``: id -> copies to keep placed (:mod:`modelplex_router.pins`).
    pinned: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_deployment(cls, deployment: Deployment, env: Mapping[str, str] = os.environ) -> RouterConfig:
        spec = deployment.spec
        policy = env.get(ENV_POLICY, DEFAULT_POLICY)
        if policy not in POLICIES:
            raise ValueError(f"{ENV_POLICY}: must be one of {', '.join(POLICIES)} (got {policy!r})")
        order = env.get(ENV_QUEUE_ORDER) or "fair"
        if order not in ORDERS:
            raise ValueError(f"{ENV_QUEUE_ORDER}: must be one of {', '.join(ORDERS)} (got {order!r})")
        rules = ModelRules(spec.models)
        return cls(
            deployment=deployment.name,
            params=Params(
                max_ongoing=spec.max_ongoing_requests,
                matching_timeout_s=spec.multiplexing.matching_timeout_seconds,
                limits=rules,
            ),
            queue_order=order,
            models=rules,
            load_quota=spec.router.load_quota,
            max_queued_requests=spec.router.max_queued_requests,
            policy=policy,
            max_request_bytes=spec.max_request_bytes,
            model_label=spec.metrics.model_label,
            first_byte_timeout_s=spec.request_timeout_s,
            queue_timeout_s=_positive(env, ENV_QUEUE_TIMEOUT, DEFAULT_QUEUE_TIMEOUT_S),
            poll_interval_s=_positive(env, ENV_POLL_INTERVAL, DEFAULT_POLL_INTERVAL_S),
            hold_at_zero_s=_positive(env, ENV_HOLD_AT_ZERO, DEFAULT_HOLD_AT_ZERO_S) if spec.autoscaling else None,
            model_control=spec.router.model_control,
            body_timeout_s=spec.router.body_timeout_seconds,
            stream_idle_timeout_s=spec.router.stream_idle_timeout_seconds,
            upstream_idle_s=idle_keep_s(spec.router.idle_timeout_seconds),
            not_found_s=spec.multiplexing.not_found_cache_seconds,
            cors=spec.router.cors,
            access_log=spec.router.access_log,
            auth=spec.router.auth,
            forward_credentials=spec.router.forward_credentials,
            client_tokens_dir=env.get(ENV_CLIENT_TOKENS_DIR) or None,
            internal_token_file=env.get(ENV_INTERNAL_TOKEN_FILE) or None,
            legacy_token_file=env.get(ENV_LEGACY_TOKEN_FILE) or None,
            run_token_file=env.get(ENV_RUN_TOKEN_FILE) or None,
            caller_tokens_dir=env.get(ENV_CALLER_TOKENS_DIR) or None,
            pinned=spec.pinned_models,
        )


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: must be a number (got {raw!r})") from None
    if value <= 0:
        raise ValueError(f"{name}: must be > 0 (got {raw!r})")
    return value
