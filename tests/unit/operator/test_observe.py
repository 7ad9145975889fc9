"""The index functions and views the status keeper reads."""

from __future__ import annotations

from unit.operator.objects import UID, body

from modelplex_operator.handlers.observe import (Indexes, index_deployment, index_replica_pod, index_resource,
                                                 owner_key, resource_of, resource_view)
from modelplex_operator.status import PodView


def test_resource_view_is_plain_and_an_event_target():
    doc = body(generation=4)
    doc["metadata"]["resourceVersion"] = "17"
    doc["status"] = {"readyReplicas": 1}
    view = resource_view(doc)
    assert view["apiVersion"] == "modelplex.io/v1alpha1" and view["kind"] == "MultiplexedDeployment"
    assert view["metadata"]["uid"] == UID and view["metadata"]["generation"] == 4
    assert view["spec"] == doc["spec"] and view["spec"] is not doc["spec"]
    assert index_resource(doc, "team-a", "recs") == {("team-a", "recs"): view}
    resource = resource_of(view, None, "bad")
    assert (resource.name, resource.namespace, resource.generation, resource.spec_problem) == ("recs", "team-a", 4, "bad")
    assert resource.status == {"readyReplicas": 1}


def test_pods_and_deployments_are_keyed_by_their_resource():
    pod = {"metadata": {"name": "recs-replica-1"}, "status": {}}
    assert index_replica_pod(pod, "team-a", {"modelplex.io/deployment": "recs"}) == {
        ("team-a", "recs"): PodView("recs-replica-1")}
    assert index_replica_pod(pod, "team-a", {}) is None
    dep = {"metadata": {"name": "recs-router", "labels": {"modelplex.io/role": "router"}}, "spec": {"replicas": 1}}
    (key, view), = index_deployment(dep, "team-a", {"modelplex.io/deployment": "recs"}).items()
    assert key == ("team-a", "recs") and view.role == "router" and view.replicas == 1
    assert owner_key("ns", {"modelplex.io/deployment": "x"}) == ("ns", "x")
    assert owner_key("ns", {}) is None


def test_indexes_read_plain_mappings_like_kopf_indexes():
    view = resource_view(body())
    indexes = Indexes(
        resources={("team-a", "recs"): [view]},
        pods={("team-a", "recs"): [PodView("a"), PodView("b")]},
        deployments={},
    )
    assert indexes.resource(("team-a", "recs")) == view
    assert indexes.resource(("team-a", "other")) is None
    assert [p.name for p in indexes.pods_of(("team-a", "recs"))] == ["a", "b"]
    assert indexes.deployments_of(("team-a", "recs")) == []
    assert indexes.resource_keys() == [("team-a", "recs")]
