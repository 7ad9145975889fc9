"""Ray's ``user_config`` in a cluster, end to end: the replica applies ``spec.userConfig`` at its
start; a re-apply whose only change is ``userConfig`` reaches the live replica's ``reconfigure``
through the operator (the chart's operator, from its own pod, with the deployment's credential):
no rollout, no restart, an Event and the status say it was applied. A ``reconfigure`` that
raises is an Event and a condition; the replica serves on with the value it had."""

from __future__ import annotations

import pytest
from kubernetes import client

from modelplex.wire.user_config import config_hash
from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import (condition, get_mxd, kubectl_apply, manifest, pods, predict, router_url, wait_event,
                                  wait_settled)

pytestmark = pytest.mark.e2e


def user_config_status(api, ns: str, name: str, wanted: str, value: dict) -> dict | None:
    """The resource once its status is about ``value`` and UserConfigApplied is ``wanted`` ("True"/"False")."""
    obj = get_mxd(api, ns, name)
    about = ((obj.get("status") or {}).get("userConfig") or {}).get("hash") == config_hash(value)
    return obj if about and condition(obj, "UserConfigApplied").get("status") == wanted else None


def test_a_change_of_user_config_alone_reconfigures_the_live_replica_without_a_rollout(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "configured"
    doc = manifest(name, replicas=1, handler="mxd_handler:Configured", userConfig={"greeting": "hello"})
    kubectl_apply(control_plane, ns, doc)
    wait_settled(api, ns, name, replicas=1)
    url = router_url(control_plane, ns, name)
    code, answer = predict(url, "m", {})
    assert code == 200 and (answer["greeting"], answer["reconfigured"]) == ("hello", 1), answer  # at its start
    [pod] = pods(api, ns, name)
    generation = client.AppsV1Api(api).read_namespaced_deployment(f"{name}-replica", ns).metadata.generation

    doc["spec"]["userConfig"] = {"greeting": "bonjour"}
    kubectl_apply(control_plane, ns, doc)
    applied = wait_event(api, ns, name, "UserConfigApplied", timeout=60)
    assert applied[0] == "Normal" and "1 ready replica(s)" in applied[2]
    code, answer = predict(url, "m", {})
    assert code == 200 and answer == {"greeting": "bonjour", "reconfigured": 2, "pod": pod.metadata.name}, answer
    [same] = pods(api, ns, name)
    assert same.metadata.uid == pod.metadata.uid and same.status.container_statuses[0].restart_count == 0
    assert client.AppsV1Api(api).read_namespaced_deployment(f"{name}-replica", ns).metadata.generation == generation
    # The status is written just after the Event is posted.
    obj = wait_for(lambda: user_config_status(api, ns, name, "True", {"greeting": "bonjour"}), timeout=30, interval=0.5,
                   what="UserConfigApplied True")
    assert obj["status"]["userConfig"]["applied"] == 1
    assert obj["status"]["userConfig"]["replicas"] == [{"name": pod.metadata.name,
                                                        "hash": obj["status"]["userConfig"]["hash"]}]

    doc["spec"]["userConfig"] = {"greeting": ""}  # the handler's reconfigure raises
    kubectl_apply(control_plane, ns, doc)
    failed = wait_event(api, ns, name, "ReconfigureFailed", timeout=60)
    assert failed[0] == "Warning" and "the greeting must not be empty" in failed[2]
    cond = condition(wait_for(lambda: user_config_status(api, ns, name, "False", {"greeting": ""}), timeout=30,
                              interval=0.5,
                              what="UserConfigApplied False"), "UserConfigApplied")
    assert cond["reason"] == "ReconfigureFailed" and pod.metadata.name in cond["message"]
    code, answer = predict(url, "m", {})
    assert code == 200 and answer["greeting"] == "bonjour", answer  # serves on with the value it had
    [still] = pods(api, ns, name)
    assert still.metadata.uid == pod.metadata.uid and still.status.container_statuses[0].restart_count == 0
