"""The replica's Prometheus metrics, one registry per app.

Request series are ``modelplex_replica_*`` and the router's ``modelplex_router_*``: one request
passes both, and distinct names keep a ``sum()`` over a deployment's pods from counting it twice.
Model and batch series (loads, evictions, batch sizes) exist only here. Series without a model
label exist at 0 from the start, so ``rate()`` and alerts see them before the first event.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from modelplex.cache import ModelCache

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
        self.loads = Counter("modelplex_model_loads", "Model loads, by tier: cold (fetch and build) or warm "
                             "(from the warm tier).", ("deployment", "tier", *model), registry=r)
        self.load_failures = Counter(
            "modelplex_model_load_failures", "Model loads that failed.", ("deployment", *model), registry=r
        )
        self.load_seconds = Histogram(
            "modelplex_model_load_seconds", "Time to load a model.", ("deployment",), buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.evictions = Counter("modelplex_model_evictions", "Models evicted.", ("deployment", *model), registry=r)
        self.models_loaded = Gauge("modelplex_models_loaded", "Models in the cache.", ("deployment",), registry=r)
        self.model_bytes = Gauge("modelplex_model_bytes", "Measured device memory of loaded models.",
                                 ("deployment", *model), registry=r)
        self.reserved_bytes = Gauge("modelplex_model_reserved_bytes",
                                    "Device memory reserved by model loads in flight.", ("deployment",), registry=r)
        self.capacity_bytes = Gauge("modelplex_model_capacity_bytes",
                                    "The model memory budget (0: models are only counted).", ("deployment",), registry=r)
        self.loads_running = Gauge("modelplex_model_loads_running", "Model loads running.", ("deployment",),
                                   registry=r)
        self.loads_queued = Gauge("modelplex_model_loads_queued", "Model loads waiting for a load slot.",
                                  ("deployment",), registry=r)
        self.inflight = Gauge("modelplex_replica_inflight_requests", "Requests in flight on the replica.", ("deployment",),
                              registry=r)
        self._sized: set[str] = set()  # models with a modelplex_model_bytes series
        # Children looked up once: ``labels()`` takes a lock and builds a key on every call,
        # which every request would pay several times.
        self.inflight_now = self.inflight.labels(deployment)
        self._answered: dict[int, Counter] = {}
        self._latency_all = None if per_model else self.latency.labels(deployment)
        self._zeros()

    def _zeros(self) -> None:
        d = self.deployment
        metric: Histogram | Counter | Gauge
        for metric in (self.batch_size, self.batch_wait, self.load_seconds, self.models_loaded, self.inflight,
                       self.reserved_bytes, self.capacity_bytes, self.loads_running, self.loads_queued):
            metric.labels(d)
        self.requests.labels(d, "200")
        if not self.per_model:
            for metric in (self.latency, self.load_failures, self.evictions, self.model_bytes):
                metric.labels(d)
            for tier in ("cold", "warm"):
                self.loads.labels(d, tier)

    def _labels(self, model_id: str) -> tuple[str, ...]:
        return (self.deployment, model_id) if self.per_model else (self.deployment,)

    def on_cache_event(self, event: str, model_id: str, seconds: float) -> None:
        if event in ("loaded", "loaded_warm"):
            tier = "warm" if event == "loaded_warm" else "cold"
            self.loads.labels(self.deployment, tier, *self._labels(model_id)[1:]).inc()
            self.load_seconds.labels(self.deployment).observe(seconds)
        elif event == "load_failed":
            self.load_failures.labels(*self._labels(model_id)).inc()
        elif event == "evicted":
            self.evictions.labels(*self._labels(model_id)).inc()

    def observe_cache(self, cache: ModelCache) -> None:
        """The cache's sizes, after each of its changes."""
        d = self.deployment
        sizes = cache.model_bytes
        self.models_loaded.labels(d).set(len(sizes))
        self.reserved_bytes.labels(d).set(cache.bytes_reserved)
        self.capacity_bytes.labels(d).set(cache.capacity_bytes or 0)
        self.loads_running.labels(d).set(cache.loads_running)
        self.loads_queued.labels(d).set(cache.loads_queued)
        if not self.per_model:
            self.model_bytes.labels(d).set(sum(sizes.values()))
            return
        for gone in self._sized - sizes.keys():
            self.model_bytes.remove(d, gone)
        for model_id, nbytes in sizes.items():
            self.model_bytes.labels(d, model_id).set(nbytes)
        self._sized = set(sizes)

    def on_batch(self, model_id: str, size: int, waited_s: float) -> None:
        self.batch_size.labels(self.deployment).observe(size)
        self.batch_wait.labels(self.deployment).observe(waited_s)

    def observe_request(self, model_id: str, code: int, seconds: float) -> None:
        answered = self._answered.get(code)
        if answered is None:
            answered = self._answered[code] = self.requests.labels(self.deployment, str(code))
        answered.inc()
        latency = self._latency_all or self.latency.labels(*self._labels(model_id))
        latency.observe(seconds)
