"""Router settings from the spec and the environment; the metrics' names and labels; imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from modelplex.wire.spec import parse_deployment
from modelplex_router.config import ENV_POLICY, ENV_QUEUE_TIMEOUT, RouterConfig
from modelplex_router.metrics import RouterMetrics
from modelplex_router.policy import Kind


def deployment(**spec):
    return parse_deployment({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "recs"},
        "spec": {"image": "i", "handler": "m:C", **spec},
    })


def test_the_config_follows_the_spec():
    config = RouterConfig.from_deployment(deployment(
        maxOngoingRequests=7, multiplexing={"matchingTimeoutSeconds": 0.25}, maxRequestBytes=4096,
        metrics={"modelLabel": True},
    ), env={})
    assert config.deployment == "recs"
    assert config.params.max_ongoing == 7 and config.params.matching_timeout_s == 0.25
    assert config.max_request_bytes == 4096 and config.model_label
    assert config.policy == "cache-aware"


def test_the_first_byte_timeout_is_the_spec_request_timeout():
    assert RouterConfig.from_deployment(deployment(router={"requestTimeoutSeconds": 4}), env={}).first_byte_timeout_s == 4
    # Unset: past the load timeout, so a slow load ends with the replica's own 504.
    config = RouterConfig.from_deployment(deployment(multiplexing={"loadTimeoutSeconds": 60}), env={})
    assert config.first_byte_timeout_s == 90


def test_environment_overrides_and_their_checks():
    config = RouterConfig.from_deployment(deployment(), env={ENV_POLICY: "random", ENV_QUEUE_TIMEOUT: "0.5"})
    assert config.policy == "random" and config.queue_timeout_s == 0.5
    with pytest.raises(ValueError, match=ENV_POLICY):
        RouterConfig.from_deployment(deployment(), env={ENV_POLICY: "round-robin"})
    with pytest.raises(ValueError, match=ENV_QUEUE_TIMEOUT):
        RouterConfig.from_deployment(deployment(), env={ENV_QUEUE_TIMEOUT: "-1"})


def _samples(metrics: RouterMetrics) -> dict[str, float]:
    out = {}
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_requests_and_routing_decisions():
    metrics = RouterMetrics("recs")
    metrics.observe(200, 0.01, "m1")
    metrics.observe(200, 0.02, "m2")
    metrics.observe(503, 0.5, "m1")
    for kind in (Kind.HIT, Kind.HIT, Kind.MISS, Kind.FALLBACK, Kind.ANY):
        metrics.routed(kind, "m1")
    metrics.retried("replica_failed")
    samples = _samples(metrics)
    assert samples['modelplex_router_requests_total{code="200",deployment="recs",protocol="http"}'] == 2
    assert samples['modelplex_router_requests_total{code="503",deployment="recs",protocol="http"}'] == 1
    assert samples['modelplex_router_request_latency_seconds_count{deployment="recs",protocol="http"}'] == 3
    assert samples['modelplex_router_cache_hits_total{deployment="recs"}'] == 2
    assert samples['modelplex_router_cache_misses_total{deployment="recs"}'] == 2  # a fallback is a miss too
    assert samples['modelplex_router_fallbacks_total{deployment="recs"}'] == 1
    assert samples['modelplex_router_retries_total{deployment="recs",reason="replica_failed"}'] == 1
    assert 'modelplex_router_inflight_requests{deployment="recs"}' in samples
    assert not any('model="' in name for name in samples)


def test_the_model_label_only_when_turned_on():
    metrics = RouterMetrics("recs", model_label=True)
    metrics.observe(200, 0.01, "m1")
    metrics.routed(Kind.HIT, "m1")
    samples = _samples(metrics)
    assert samples['modelplex_router_requests_total{code="200",deployment="recs",model="m1",protocol="http"}'] == 1
    assert samples['modelplex_router_cache_hits_total{deployment="recs",model="m1"}'] == 1


def test_each_router_has_its_own_registry():
    first, second = RouterMetrics("recs"), RouterMetrics("recs")
    first.observe(200, 0.01, "m")
    assert _samples(first)['modelplex_router_requests_total{code="200",deployment="recs",protocol="http"}'] == 1
    assert _samples(second)['modelplex_router_requests_total{code="200",deployment="recs",protocol="http"}'] == 0


def test_series_without_a_model_label_exist_at_zero_from_the_start():
    samples = _samples(RouterMetrics("recs"))
    for name in ("modelplex_router_cache_hits_total", "modelplex_router_cache_misses_total",
                 "modelplex_router_fallbacks_total", "modelplex_router_inflight_requests",
                 "modelplex_router_queued_requests"):
        assert samples[name + '{deployment="recs"}'] == 0, name
    for protocol in ("http", "grpc"):  # requests by protocol: REST and gRPC from the start
        assert samples[f'modelplex_router_request_latency_seconds_count{{deployment="recs",protocol="{protocol}"}}'] == 0
        assert samples[f'modelplex_router_requests_total{{code="200",deployment="recs",protocol="{protocol}"}}'] == 0
    assert samples['modelplex_router_retries_total{deployment="recs",reason="replica_failed"}'] == 0


def test_the_router_imports_neither_the_replica_nor_torch():
    script = (
        "import sys\n"
        "import modelplex_router.server, modelplex_router.app, modelplex_router.discovery.static\n"
        "import modelplex_router.discovery.kubernetes, modelplex_launcher.local\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'modelplex_replica'))\n"
        "print(bad)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
