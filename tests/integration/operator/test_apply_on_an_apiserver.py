"""The operator's apply against a real Kubernetes API server (the project's control plane without
a node, ``ControlPlane(node=False)``): a new object is one create, an object in step is read and
not written, a create's fields pass to the server-side apply so that fields the operator stops
setting are removed, and a same-named object the operator did not make is never written."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from modelplex.processes import wait_for
from modelplex_cluster.controlplane import ControlPlane, build_binaries
from modelplex_operator.kube import Kube, NotOwned

NS = "default"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    state: Path = tmp_path_factory.mktemp("control-plane")
    cp = ControlPlane(build_binaries(quiet=True), state_dir=state, node=False)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


def client(cp: ControlPlane) -> Kube:
    """A fresh operator client (as after a restart: it has seen nothing exist)."""
    return Kube(config.new_client_from_config(config_file=str(cp.kubeconfig)))


@pytest.fixture(scope="module")
def owner(control_plane: ControlPlane) -> str:
    """The uid of a real object the test objects name as controller (the garbage collector
    would delete objects whose owner does not exist)."""
    made = client(control_plane).create({"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": "the-owner", "namespace": NS}})
    return str(made["metadata"]["uid"])


def ours(owner: str, name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": data, "metadata": {
        "name": name, "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "modelplex-operator", "tier": "a"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "the-owner", "uid": owner,
                             "controller": True}]}}


def managers(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(entry["manager"], entry["operation"]) for entry in obj["metadata"].get("managedFields") or ()
            if entry["manager"] == "modelplex-operator"]


def test_a_created_object_is_then_in_step_and_drops_the_fields_the_operator_stops_setting(control_plane, owner):
    created = client(control_plane).apply(ours(owner, "c1", a="1", b="2"), owner)
    assert created.action == "created" and managers(created.after) == [("modelplex-operator", "Update")]
    restarted = client(control_plane)
    same = restarted.apply(ours(owner, "c1", a="1", b="2"), owner)
    # In step: not written, not even to hand the create's fields to the apply (that waits for a change).
    assert same.action == "unchanged" and managers(same.after) == [("modelplex-operator", "Update")]
    assert same.after["metadata"]["resourceVersion"] == created.after["metadata"]["resourceVersion"]
    assert restarted.apply(ours(owner, "c1", a="1", b="2"), owner).action == "unchanged"
    dropped = ours(owner, "c1", a="1")
    del dropped["metadata"]["labels"]["tier"]
    result = restarted.apply(dropped, owner)
    assert result.action == "updated" and result.after["data"] == {"a": "1"}
    assert "tier" not in result.after["metadata"]["labels"]


def test_a_deployment_re_applied_unchanged_is_not_rolled_and_a_dropped_env_var_is_removed(control_plane, owner):
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": "d1", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "modelplex-operator"},
        "ownerReferences": ours(owner, "d1")["metadata"]["ownerReferences"]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d1"}}, "template": {
            "metadata": {"labels": {"app": "d1"}},
            "spec": {"containers": [{"name": "c", "image": "img:1", "resources": {"limits": {"memory": "1Gi"}},
                                     "env": [{"name": "E1", "value": "1"}, {"name": "E2", "value": "2"}]}]}}}}
    assert client(control_plane).apply(deployment, owner).action == "created"
    restarted = client(control_plane)
    same = restarted.apply(deployment, owner)
    assert same.action == "unchanged" and same.after["metadata"]["generation"] == 1  # no new rollout
    fewer = copy.deepcopy(deployment)
    fewer["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "E1", "value": "1"}]
    result = restarted.apply(fewer, owner)
    assert result.action == "updated"
    assert result.after["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "E1", "value": "1"}]
    assert restarted.apply(fewer, owner).action == "unchanged"


def test_a_same_named_object_the_operator_did_not_make_is_refused_and_left_as_it_is(control_plane, owner):
    someone = Kube(config.new_client_from_config(config_file=str(control_plane.kubeconfig)), field_manager="someone")
    someone.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "theirs", "namespace": NS},
                    "data": {"z": "9"}})
    kube = client(control_plane)
    for _ in range(2):
        with pytest.raises(NotOwned, match="ConfigMap theirs exists and was not made by Modelplex"):
            kube.apply(ours(owner, "theirs", a="1"), owner)
    left = kube.get("v1", "ConfigMap", NS, "theirs")
    assert left is not None and left["data"] == {"z": "9"} and managers(left) == []


def test_every_object_of_a_deployment_is_one_create_and_a_resync_of_it_only_reads(control_plane):
    """The operator's real objects (Roles, Service, NetworkPolicies, budgets ...): what the server
    adds to them does not make an unchanged deployment look changed."""
    from kubernetes import client as k8s
    from unit.operator.objects import body, deployment_of

    from modelplex.wire.names import API_GROUP, API_VERSION, PLURAL
    from modelplex_operator import builders

    api_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    control_plane.kubectl("apply", "-f", str(Path(__file__).parents[3] / "crds" / "multiplexeddeployments.modelplex.io.yaml"))
    doc = body(namespace=NS)
    del doc["metadata"]["uid"], doc["metadata"]["generation"]
    custom = k8s.CustomObjectsApi(api_client)
    made = wait_for(lambda: custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, doc),
                    60, 0.5, "the CRD served", retry_on=(Exception,))
    owner = builders.owner_reference(made)
    objects = builders.desired_objects(deployment_of(made), owner)
    first = client(control_plane)
    assert {first.apply(obj, owner["uid"]).action for obj in objects} == {"created"}
    restarted = client(control_plane)
    assert [restarted.apply(obj, owner["uid"]).action for obj in objects] == ["unchanged"] * len(objects)
    assert [restarted.apply(obj, owner["uid"]).action for obj in objects] == ["unchanged"] * len(objects)


def test_the_inference_pool_waits_for_its_crd_then_is_applied_as_its_schema_takes_it_and_goes_with_the_picker(
        control_plane, owner):
    """Without the Gateway API Inference Extension's CRD the pool is a False condition and no
    error; with the vendored CRD applied, the server takes the pool as built (its v1 schema:
    selector.matchLabels, targetPorts, endpointPickerRef) and a resync only reads it; with the
    picker turned off the operator deletes it."""
    from kubernetes import client as k8s
    from unit.operator.objects import body, deployment_of

    from modelplex.wire.names import REPLICA_PORT
    from modelplex_operator import builders
    from modelplex_operator.pools import CRD_MISSING, ENDPOINT_PICKER, POOL_APPLIED, InferencePools

    custom = k8s.CustomObjectsApi(config.new_client_from_config(config_file=str(control_plane.kubeconfig)))
    doc = body(name="gw", namespace=NS, router={"replicas": 1, "port": 8000, "endpointPicker": {
        "enabled": True, "failureMode": "FailOpen"}})
    deployment = deployment_of(doc)
    # A real object as the owner (the pool's is the MultiplexedDeployment; any kind does here).
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "the-owner", "uid": owner, "controller": True}

    missing = InferencePools(client(control_plane)).sync(deployment, owner, 1)
    assert missing.condition["type"] == ENDPOINT_PICKER
    assert (missing.condition["status"], missing.condition["reason"]) == ("False", CRD_MISSING)
    assert missing.warn and missing.result is None

    crd = Path(__file__).parents[3] / "tests/e2e/vendor/gateway-api-inference-extension" / \
        "inference.networking.k8s.io_inferencepools.yaml"
    control_plane.kubectl("apply", "-f", str(crd))
    pools = InferencePools(client(control_plane))
    applied = wait_for(lambda: _applied(pools.sync(deployment, owner, 1)), 60, 0.5, "the InferencePool CRD served")
    assert (applied.condition["status"], applied.condition["reason"]) == ("True", POOL_APPLIED)
    assert applied.result.action == "created"
    pool = custom.get_namespaced_custom_object("inference.networking.k8s.io", "v1", NS, "inferencepools", "gw")
    assert pool["spec"]["selector"] == {"matchLabels": builders.selector("gw", "replica")}
    assert pool["spec"]["targetPorts"] == [{"number": REPLICA_PORT}]
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "gw", "port": {"number": 9002},
                                                 "failureMode": "FailOpen"}
    assert pool["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]
    assert InferencePools(client(control_plane)).sync(deployment, owner, 1).result.action == "unchanged"

    off = deployment_of(body(name="gw", namespace=NS))
    assert InferencePools(client(control_plane)).sync(off, owner, 2).condition is None
    assert client(control_plane).get("inference.networking.k8s.io/v1", "InferencePool", NS, "gw") is None


def _applied(synced):
    if synced.result is None:
        raise AssertionError(f"not applied yet: {synced.condition}")
    return synced


def test_a_change_of_user_config_alone_rewrites_the_spec_config_map_and_rolls_no_pod(control_plane):
    """Ray's reconfigure in a cluster: the CRD keeps any JSON as spec.userConfig; changed alone,
    only the spec ConfigMap (what a new pod reads) is written, the replica Deployment's template
    is the same (no rollout; the operator sends the value to the live replicas). The status the
    operator reports about it, and about pods no node can take, is kept and shown by kubectl."""
    from kubernetes import client as k8s
    from unit.operator.objects import body, deployment_of

    from modelplex.wire.names import API_GROUP, API_VERSION, PLURAL
    from modelplex_operator import builders

    custom = k8s.CustomObjectsApi(config.new_client_from_config(config_file=str(control_plane.kubeconfig)))
    control_plane.kubectl("apply", "-f", str(Path(__file__).parents[3] / "crds" / "multiplexeddeployments.modelplex.io.yaml"))
    user_config = {"threshold": 0.5, "labels": ["cat", "dog"], "nested": {"off": None, "depth": [1, [2]]}}
    doc = body(name="uc", namespace=NS, userConfig=user_config)
    del doc["metadata"]["uid"], doc["metadata"]["generation"]
    made = wait_for(lambda: custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, doc),
                    60, 0.5, "the CRD served", retry_on=(Exception,))
    assert made["spec"]["userConfig"] == user_config  # not pruned: any JSON
    owner = builders.owner_reference(made)
    kube = client(control_plane)
    assert {kube.apply(obj, owner["uid"]).action for obj in builders.desired_objects(deployment_of(made), owner)} \
        == {"created"}
    edited = copy.deepcopy(made)
    edited["spec"]["userConfig"] = {"threshold": 0.9}  # as kubectl apply of an edited manifest
    changed = custom.replace_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, "uc", edited)
    assert changed["spec"]["userConfig"] == {"threshold": 0.9}
    actions = {builders.describe(obj): kube.apply(obj, owner["uid"]).action
               for obj in builders.desired_objects(deployment_of(changed), owner)}
    assert actions.pop("ConfigMap uc-spec") == "updated"
    assert set(actions.values()) == {"unchanged"}  # the replica Deployment among them: no rollout
    spec_file = kube.get("v1", "ConfigMap", NS, "uc-spec")["data"][builders.SPEC_FILE]
    assert "threshold: 0.9" in spec_file

    reported = {"unschedulable": "nvidia.com/gpu",
                "userConfig": {"hash": "0123456789abcdef", "applied": 1,
                               "replicas": [{"name": "uc-replica-0", "hash": "0123456789abcdef"}]},
                "conditions": [{"type": "PodsScheduled", "status": "False", "reason": "Unschedulable",
                                "message": "1 replica pod(s) Pending, no node can take them: 0/1 nodes are available: "
                                           "1 Insufficient nvidia.com/gpu.",
                                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}]}
    written = kube.patch_status(NS, "uc", made["metadata"]["uid"], reported)
    assert {key: written["status"][key] for key in reported} == reported
    table = control_plane.kubectl("get", "mxd", "uc", "-n", NS).stdout
    assert "UNSCHEDULABLE" in table and "nvidia.com/gpu" in table
