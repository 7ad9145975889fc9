"""The router's settings default to the spec module's defaults, not to numbers of its own."""

from __future__ import annotations

from modelplex.wire.spec import parse_deployment
from modelplex_router.config import RouterConfig
from modelplex_router.policy import Params


def test_a_bare_config_and_one_from_a_spec_that_leaves_everything_out_agree():
    bare_spec = parse_deployment({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "recs"},
        "spec": {"image": "i", "handler": "m:C"},
    })
    from_spec = RouterConfig.from_deployment(bare_spec, env={})
    bare = RouterConfig("recs", Params(max_ongoing=bare_spec.spec.max_ongoing_requests))

    assert bare.max_request_bytes == from_spec.max_request_bytes == bare_spec.spec.max_request_bytes
    assert bare.first_byte_timeout_s == from_spec.first_byte_timeout_s == bare_spec.spec.request_timeout_s
    assert (bare.policy, bare.queue_timeout_s, bare.poll_interval_s) == (
        from_spec.policy, from_spec.queue_timeout_s, from_spec.poll_interval_s)


def test_idle_connections_to_replicas_are_dropped_before_the_replicas_own_idle_timeout_would():
    def config(**router) -> RouterConfig:
        return RouterConfig.from_deployment(parse_deployment({
            "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "recs"},
            "spec": {"image": "i", "handler": "m:C", "router": router}}), env={})

    assert config().upstream_idle_s == 30.0  # the replicas keep theirs 60 s
    assert config(idleTimeoutSeconds=8).upstream_idle_s == 4.0
    assert RouterConfig("recs", Params(max_ongoing=1)).upstream_idle_s == 30.0
