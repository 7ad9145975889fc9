"""The router's Prometheus metrics, in a registry of its own (one per app, so tests and several
routers in one process do not collide).

Every name starts ``modelplex_router_``, and the replica's never do: a request counted by the
router and again by the replica that answered it are two series with different names, so a
``sum()`` over a deployment's pods never counts a request twice, and a query needs no label
filter to be right (a ``component`` label would make the unfiltered sum the wrong one). The
router's latency is the client's (queueing and retries included); the replica's is its own.
Series without a model label exist at 0 from the start, so ``rate()`` and alerts see them.

Requests are counted and timed by ``protocol``: ``http`` (REST, the OIP's included), ``grpc``
(the OIP over gRPC, whose ``code`` is the HTTP status the same request gets over REST) or
``gateway`` (a request a Gateway asked the Endpoint Picker about: its latency is the decision's
and the answer's as the Gateway reported them).

A ``model`` label is added only when ``spec.metrics.modelLabel`` is
on: thousands of models would otherwise swamp Prometheus. Even then an id gets a series of its
own only once a replica has loaded it (:meth:`RouterMetrics.label_loaded_only`), and at most
:data:`MAX_MODEL_LABELS` ids do: every other request (an id nobody has, a client's made-up ones)
counts under ``model="other"``, so what clients send cannot grow the series. Label children are
cached, since ``labels()`` takes a lock and builds a key on every call.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from modelplex_router.policy import Kind

# From sub-millisecond (router overhead on a cached model) to minutes (a cold load).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: The ``protocol`` label's values.
PROTOCOLS = ("http", "grpc", "gateway")
#: Distinct ``client`` label values of the quota refusals (addresses where auth is off are
#: unbounded); the rest are counted under :data:`OTHER_CLIENTS`.
MAX_CLIENT_LABELS = 100
OTHER_CLIENTS = "other"
#: Distinct ``model`` label values (``spec.metrics.modelLabel``); later models count under
#: :data:`OTHER_MODELS`, as do ids no replica has loaded.
MAX_MODEL_LABELS = 1000
OTHER_MODELS = "other"


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
        # Where requests wait, cold requests refused, load quotas spent (see README, "Sharing between models").
        wait_help = "Time a request waited in the router for a replica slot (0 when one was free)."
        self._queue_wait = Histogram("modelplex_router_queue_wait_seconds", wait_help, ["deployment", *extra],
                                     buckets=LATENCY_BUCKETS, registry=r)
        cold_help = "Requests answered 503 model_not_loaded (onCold: reject) for a model no ready replica held."
        self._cold_rejections = Counter("modelplex_router_cold_rejections_total", cold_help, ["deployment", *extra],
                                        registry=r)
        quota_help = (f"Requests refused 429 for a spent load quota, by client (at most {MAX_CLIENT_LABELS} names, "
                      f"the rest as {OTHER_CLIENTS!r}).")
        self._quota_refusals = Counter("modelplex_router_load_quota_refusals_total", quota_help,
                                       ["deployment", "client"], registry=r)
        self._client_labels: set[str] = set()
        self._model_labels: set[str] = {""}  # "" (no model named) is one series, as ever
        self._is_loaded: Callable[[str], bool] = lambda model: True
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
            for metric in (self._hits, self._misses, self._fallbacks, self._cold_rejections):
                self._child(metric)
            self._child(self._queue_wait)
            for protocol in PROTOCOLS:
                self._child(self._latency, protocol)
                self._child(self._requests, "200", protocol)

    def _child(self, metric, *labels: str):
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.deployment, *labels)
        return child

    def label_loaded_only(self, is_loaded: Callable[[str], bool]) -> None:
        """Give a model its own series only once ``is_loaded(model)`` (a replica has loaded it);
        until then, and past :data:`MAX_MODEL_LABELS`, it counts as :data:`OTHER_MODELS`."""
        self._is_loaded = is_loaded

    def _labels(self, model: str) -> tuple[str, ...]:
        """The model label values of a request for ``model``: none without the model label."""
        if not self.model_label:
            return ()
        if model in self._model_labels:
            return (model,)
        if len(self._model_labels) < MAX_MODEL_LABELS and self._is_loaded(model):
            self._model_labels.add(model)
            return (model,)
        return (OTHER_MODELS,)

    def observe(self, status: int, seconds: float, model: str, *, protocol: str = "http") -> None:
        """One request over ``protocol`` answered with ``status`` after ``seconds``."""
        labels = self._labels(model)
        self._child(self._requests, str(status), protocol, *labels).inc()
        self._child(self._latency, protocol, *labels).observe(seconds)

    def routed(self, kind: Kind, model: str) -> None:
        """One routing decision of kind ``kind``."""
        if kind is Kind.ANY:
            return
        labels = self._labels(model)
        if kind is Kind.HIT:
            self._child(self._hits, *labels).inc()
            return
        self._child(self._misses, *labels).inc()
        if kind is Kind.FALLBACK:
            self._child(self._fallbacks, *labels).inc()

    def waited(self, model: str, seconds: float) -> None:
        """A request for ``model`` got its first replica slot after ``seconds`` in the queue."""
        self._child(self._queue_wait, *self._labels(model)).observe(seconds)

    def cold_rejected(self, model: str) -> None:
        """A request for ``model`` answered 503 ``model_not_loaded``."""
        self._child(self._cold_rejections, *self._labels(model)).inc()

    def quota_refused(self, client: str) -> None:
        """A request of ``client`` refused for its spent load quota (a bounded label set)."""
        if client not in self._client_labels:
            if len(self._client_labels) >= MAX_CLIENT_LABELS:
                client = OTHER_CLIENTS
            else:
                self._client_labels.add(client)
        self._child(self._quota_refusals, client).inc()

    def watch_queues(self, waiting: Callable[[], Iterable[tuple[str, int]]]) -> None:
        """With the model label, the requests waiting per model (``waiting()``: the models that
        have waiters now, read at each scrape: models that wait no more have no series)."""
        if self.model_label:
            self.registry.register(_ModelQueues(self.deployment, waiting, lambda model: self._labels(model)[0]))

    def retried(self, reason: str) -> None:
        self._child(self._retries, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ModelQueues(Collector):
    """``modelplex_router_model_queued_requests``: the waiters of each model now."""

    def __init__(self, deployment: str, waiting: Callable[[], Iterable[tuple[str, int]]],
                 label: Callable[[str], str]):
        self.deployment = deployment
        self.waiting = waiting
        self.label = label  # a model's label value: its id, or "other"

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # unchecked (auto_describe would call collect at registration)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("modelplex_router_model_queued_requests",
                                   "Requests waiting for a replica slot now, by model.",
                                   labels=["deployment", "model"])
        counts: dict[str, int] = {}
        for model, count in self.waiting():
            label = self.label(model)
            counts[label] = counts.get(label, 0) + count
        for label, count in counts.items():
            family.add_metric([self.deployment, label], count)
        yield family
