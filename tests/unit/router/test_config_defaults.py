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
