"""``spec.router.callers``: deployment names, each once, never the router's own ``internal``;
errors name the field."""

from __future__ import annotations

import pytest

from modelplex.wire.spec import SpecError, parse_deployment


def deployment(callers):
    return parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                             "metadata": {"name": "recs"},
                             "spec": {"image": "local", "handler": "h:H", "router": {"callers": callers}}})


def test_callers_are_none_by_default_and_deployment_names_when_given():
    assert parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                             "metadata": {"name": "recs"},
                             "spec": {"image": "local", "handler": "h:H"}}).spec.router.callers == ()
    assert deployment(["frontend", "batch-2"]).spec.router.callers == ("frontend", "batch-2")


@pytest.mark.parametrize("callers, message", [
    (["Frontend"], "each caller must be a deployment's name"),
    (["internal"], "'internal' is the router's name for its own components"),
    (["a", "a"], "each caller once"),
])
def test_a_bad_caller_is_refused_naming_the_field(callers, message):
    with pytest.raises(SpecError) as caught:
        deployment(callers)
    assert message in str(caught.value) and "spec.router.callers" in str(caught.value)
