"""The replica's Prometheus metrics, one registry per app.

Request series are ``modelplex_replica_*`` and the router's ``modelplex_router_*``: one request
passes both, and distinct names keep a ``sum()`` over a deployment's pods from counting it twice.
Model and batch series (loads, evictions, batch sizes) exist only here. Series without a model
label exist at 0 from the start, so ``rate()`` and alerts see them before the first event.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

disable_created_metrics()  # the *_created series double the output and nobody graphs them

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ReplicaMetrics:
    """``model`` labels only when ``per_model`` is on: thousands of models would swamp Prometheus."""

    def __init__(self, deployment: str, *, per_model: bool = False):
        self.registry = CollectorRegistry()
        self.deployment = deployment
        self.per_model = per_model
        model = ("model",) if per_model else ()
        r = self.registry
        self.requests = Counter(
            "modelplex_replica_requests", "Requests answered by the replica, by status code.", ("deployment", "code"),
            registry=r,
        )
        self.latency = Histogram(
            "modelplex_replica_request_latency_seconds", "Request latency on the replica.", ("deployment", *model),
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "modelplex_batch_size", "Requests per batch.", ("deployment",), buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_wait = Histogram(
            "modelplex_batch_wait_seconds", "How long a batch's first request waited for the batch to form.",
            ("deployment",), buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.loads = Counter("modelplex_model_loads", "Model loads.", ("deployment", *model), registry=r)
        self.load_failures = Counter(
            "modelplex_model_load_failures", "Model loads that failed.", ("deployment", *model), registry=r
        )
        self.load_seconds = Histogram(
            "modelplex_model_load_seconds", "Time to load a model.", ("deployment",), buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.evictions = Counter("modelplex_model_evictions", "Models evicted.", ("deployment", *model), registry=r)
        self.models_loaded = Gauge("modelplex_models_loaded", "Models in the cache.", ("deployment",), registry=r)
        self.inflight = Gauge("modelplex_replica_inflight_requests", "Requests in flight on the replica.", ("deployment",),
                              registry=r)
        self._zeros()

    def _zeros(self) -> None:
        d = self.deployment
        for metric in (self.batch_size, self.batch_wait, self.load_seconds, self.models_loaded, self.inflight):
            metric.labels(d)
        self.requests.labels(d, "200")
        if not self.per_model:
            for metric in (self.latency, self.loads, self.load_failures, self.evictions):
                metric.labels(d)

    def _labels(self, model_id: str) -> tuple[str, ...]:
        return (self.deployment, model_id) if self.per_model else (self.deployment,)

    def on_cache_event(self, event: str, model_id: str, seconds: float) -> None:
        if event == "loaded":
            self.loads.labels(*self._labels(model_id)).inc()
            self.load_seconds.labels(self.deployment).observe(seconds)
        elif event == "load_failed":
            self.load_failures.labels(*self._labels(model_id)).inc()
        elif event == "evicted":
            self.evictions.labels(*self._labels(model_id)).inc()

    def on_batch(self, model_id: str, size: int, waited_s: float) -> None:
        self.batch_size.labels(self.deployment).observe(size)
        self.batch_wait.labels(self.deployment).observe(waited_s)

    def observe_request(self, model_id: str, code: int, seconds: float) -> None:
        self.requests.labels(self.deployment, str(code)).inc()
        self.latency.labels(*self._labels(model_id)).observe(seconds)
