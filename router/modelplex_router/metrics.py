"""The router's Prometheus metrics, in a registry of its own (one per app, so tests and several
routers in one process do not collide).

Every name starts ``modelplex_router_``, and the replica's never do: a request counted by the
router and again by the replica that answered it are two series with different names, so a
``sum()`` over a deployment's pods never counts a request twice, and a query needs no label
filter to be right (a ``component`` label would make the unfiltered sum the wrong one). The
router's latency is the client's (queueing and retries included); the replica's is its own.
Series without a model label exist at 0 from the start, so ``rate()`` and alerts see them.

Requests are counted and timed by ``protocol``: ``http`` (REST, the OIP's included) or ``grpc``
(the OIP over gRPC, whose ``code`` is the HTTP status the same request gets over REST).

A ``model`` label is added only when ``spec.metrics.modelLabel`` is
on: thousands of models would otherwise swamp Prometheus. Label children are cached, since
``labels()`` takes a lock and builds a key on every call.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from modelplex_router.policy import Kind

# From sub-millisecond (router overhead on a cached model) to minutes (a cold load).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: The ``protocol`` label's values.
PROTOCOLS = ("http", "grpc")


class RouterMetrics:
    """Counters and histograms of one router; ``render()`` gives the exposition text."""

    def __init__(self, deployment: str, *, model_label: bool = False):
        self.deployment = deployment
        self.model_label = model_label
        self.registry = CollectorRegistry(auto_describe=True)
        extra = ["model"] if model_label else []
        r = self.registry
        self._requests = Counter(
            "modelplex_router_requests_total", "Requests answered by the router, by HTTP status and protocol.",
            ["deployment", "code", "protocol", *extra], registry=r,
        )
        self._latency = Histogram(
            "modelplex_router_request_latency_seconds", "Time from request to the end of the response, as the client sees it.",
            ["deployment", "protocol", *extra], buckets=LATENCY_BUCKETS, registry=r,
        )
        self._hits = Counter(
            "modelplex_router_cache_hits_total", "Requests sent to a replica holding (or loading) their model.",
            ["deployment", *extra], registry=r,
        )
        self._misses = Counter(
            "modelplex_router_cache_misses_total",
            "Requests sent to a replica without their model (it loads it); fallbacks included.",
            ["deployment", *extra], registry=r,
        )
        self._fallbacks = Counter(
            "modelplex_router_fallbacks_total",
            "Requests placed on a replica without their model although holders existed (all full).",
            ["deployment", *extra], registry=r,
        )
        self._inflight = Gauge(
            "modelplex_router_inflight_requests", "Requests in the router now (waiting or being answered).",
            ["deployment"], registry=r,
        )
        self._retries = Counter(
            "modelplex_router_retries_total", "Requests sent again to another replica, by reason.",
            ["deployment", "reason"], registry=r,
        )
        self._queued = Gauge(
            "modelplex_router_queued_requests", "Requests waiting for a replica slot now.",
            ["deployment"], registry=r,
        )
        self._pinned = Gauge(
            "modelplex_router_pinned_copies",
            "Declared copies (spec.models minCopies) this router placed on ready replicas (state=placed) "
            "and those no replica can take (state=missing).",
            ["deployment", "state"], registry=r,
        )
        self.pinned_placed = self._pinned.labels(deployment, "placed")
        self.pinned_missing = self._pinned.labels(deployment, "missing")
        self.inflight = self._inflight.labels(deployment)
        self.queued = self._queued.labels(deployment)
        self._children: dict[tuple, object] = {}
        for reason in ("replica_failed", "replica_full"):
            self._child(self._retries, reason)
        if not model_label:
            for metric in (self._hits, self._misses, self._fallbacks):
                self._child(metric)
            for protocol in PROTOCOLS:
                self._child(self._latency, protocol)
                self._child(self._requests, "200", protocol)

    def _child(self, metric, *labels: str):
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.deployment, *labels)
        return child

    def observe(self, status: int, seconds: float, model: str, *, protocol: str = "http") -> None:
        """One request over ``protocol`` answered with ``status`` after ``seconds``."""
        labels = (model,) if self.model_label else ()
        self._child(self._requests, str(status), protocol, *labels).inc()
        self._child(self._latency, protocol, *labels).observe(seconds)

    def routed(self, kind: Kind, model: str) -> None:
        """One routing decision of kind ``kind``."""
        if kind is Kind.ANY:
            return
        labels = (model,) if self.model_label else ()
        if kind is Kind.HIT:
            self._child(self._hits, *labels).inc()
            return
        self._child(self._misses, *labels).inc()
        if kind is Kind.FALLBACK:
            self._child(self._fallbacks, *labels).inc()

    def retried(self, reason: str) -> None:
        self._child(self._retries, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
