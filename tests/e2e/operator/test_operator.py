"""A MultiplexedDeployment end to end: the chart's operator, real pods, HTTP through the router.

Every test makes its own resource in a fresh namespace; the operator is the one installed by
``helm install`` (see conftest.py). Operator, routers and replicas are containers on the real
node, non-root on read-only root filesystems; requests go through the router Service's ClusterIP.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from kubernetes import client

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import (GONE_TIMEOUT, OWNED_KINDS, READY_TIMEOUT, expected_objects, get_mxd, kubectl_apply,
                                  loaded_models, manifest, owned, pods, predict, router_url, wait_event, wait_settled)

pytestmark = pytest.mark.e2e


def test_deploy_serve_and_report(control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "echo"
    kubectl_apply(control_plane, ns, manifest(name, replicas=2))

    obj = wait_settled(api, ns, name, replicas=2)
    status = obj["status"]
    assert status["routerService"] == f"{name}.{ns}.svc:8000"
    assert status["selector"] == f"modelplex.io/deployment={name},modelplex.io/role=replica"
    assert status["loadedModels"] == 0

    # What the operator made: each object once, owned by the resource, labelled.
    objects = owned(api, ns, name)
    for kind in OWNED_KINDS:
        assert objects[kind] == expected_objects(name)[kind], kind
    uid = obj["metadata"]["uid"]
    apps = client.AppsV1Api(api)
    for dep_name in (f"{name}-replica", f"{name}-router"):
        dep = apps.read_namespaced_deployment(dep_name, ns)
        (ref,) = dep.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("MultiplexedDeployment", name, uid, True)
        assert dep.metadata.labels["app.kubernetes.io/managed-by"] == "modelplex-operator"
    replica_pod = pods(api, ns, name)[0]
    assert replica_pod.spec.containers[0].command == ["modelplex", "replica", "--control-port", "9001"]
    # Ready through probes on the control port (below: every pod is ready).
    assert replica_pod.spec.containers[0].readiness_probe.http_get.port == "control"
    assert replica_pod.spec.service_account_name == f"{name}-replica"
    # Every pod is a container of the node's containerd, the operator's included.
    every_pod = pods(api, ns, name) + pods(api, ns, name, role="router") + [modelplex_operator.pod(api)]
    for pod in every_pod:
        (st,) = pod.status.container_statuses
        assert st.container_id.startswith("containerd://"), (pod.metadata.name, st.container_id)
        assert st.ready, pod.metadata.name

    # HTTP through the router (the pod behind Service `echo`): predictions for several models.
    url = router_url(control_plane, ns, name)
    holders = {}
    for model in ("m1", "m2", "m3", "m4"):
        code, answer = predict(url, model, {"x": model})
        assert code == 200, answer
        assert answer["model"] == model and answer["echo"] == {"x": model}
        holders[model] = answer["pod"]
    assert set(holders.values()) <= {p.metadata.name for p in pods(api, ns, name)}

    # The replicas' annotations count what they loaded (a fixed-size summary), and the status sums it.
    held = Counter(holders.values())

    def annotations_match():
        by_pod = {p.metadata.name: loaded_models(p) for p in pods(api, ns, name)}
        return all(by_pod.get(pod, 0) >= count for pod, count in held.items()) and by_pod

    by_pod = wait_for(annotations_match, timeout=60, what="the loaded-models annotations to count every model")
    assert sum(by_pod.values()) == len(holders)
    wait_for(lambda: get_mxd(api, ns, name)["status"]["loadedModels"] == 4, timeout=60,
             what="status.loadedModels == 4")

    # A repeated model goes to the replica that holds it.
    for model, holder in holders.items():
        for _ in range(3):
            code, answer = predict(url, model, {"again": True})
            assert code == 200 and answer["pod"] == holder, (model, holder, answer)

    # kubectl shows the printer columns.
    table = control_plane.kubectl("get", "mxd", name, "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "REPLICAS", "READY", "MODELS", "LOADED", "UNSCHEDULABLE", "AGE"]
    row = table[1].split()
    assert row[:4] == [name, "2", "2", "4"] and len(row) == 5  # every pod placed: UNSCHEDULABLE is empty
    wide = control_plane.kubectl("get", "mxd", name, "-n", ns, "-o", "wide").stdout
    assert "AllReplicasReady" in wide and f"{name}.{ns}.svc:8000" in wide

    # Events tell what happened.
    created = wait_event(api, ns, name, "Created")
    assert created[0] == "Normal" and f"Deployment {name}-replica" in created[2]
    assert wait_event(api, ns, name, "Ready")[0] == "Normal"


def test_scale_then_edit_rolls_the_pods(control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "roll"
    kubectl_apply(control_plane, ns, manifest(name, replicas=2))
    wait_settled(api, ns, name, replicas=2)
    apps = client.AppsV1Api(api)
    first_rs = owned(api, ns, name)["ReplicaSet"]
    first_pods = {p.metadata.name for p in pods(api, ns, name)}

    # Scale through the scale subresource: a third pod, the same template (nothing rolls).
    control_plane.kubectl("scale", "mxd", name, "-n", ns, "--replicas", "3")
    obj = wait_settled(api, ns, name, replicas=3)
    assert obj["spec"]["replicas"] == 3
    assert apps.read_namespaced_deployment(f"{name}-replica", ns).spec.replicas == 3
    assert owned(api, ns, name)["ReplicaSet"] == first_rs
    assert first_pods < {p.metadata.name for p in pods(api, ns, name)}
    scale = client.CustomObjectsApi(api).get_namespaced_custom_object_scale(
        "modelplex.io", "v1alpha1", ns, "multiplexeddeployments", name)
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == f"modelplex.io/deployment={name},modelplex.io/role=replica"
    assert "from 2 to 3" in wait_event(api, ns, name, "Scaled")[2]

    # Edit the batching settings: the pods roll and the new ones run the new settings.
    url = router_url(control_plane, ns, name)
    assert predict(url, "m1", {})[1]["max_batch_size"] == 4
    before = {p.metadata.name for p in pods(api, ns, name)}
    control_plane.kubectl("patch", "mxd", name, "-n", ns, "--type", "merge",
                          "-p", json.dumps({"spec": {"batching": {"maxBatchSize": 2}}}))
    obj = wait_settled(api, ns, name, replicas=3)
    assert obj["metadata"]["generation"] == 3

    def rolled():
        now = pods(api, ns, name, live_only=False)
        names = {p.metadata.name for p in now}
        return len(now) == 3 and not (names & before) and names

    after = wait_for(rolled, timeout=READY_TIMEOUT, what="every replica pod replaced")
    assert len(owned(api, ns, name)["ReplicaSet"]) > len(first_rs)
    assert "rolling the pods" in wait_event(api, ns, name, "RollingUpdate")[2]
    url = router_url(control_plane, ns, name)
    wait_for(lambda: predict(url, "m2", {})[1].get("max_batch_size") == 2, timeout=60,
             what="answers from the new pods with maxBatchSize 2")
    code, answer = predict(url, "m2", {})
    assert code == 200 and answer["pod"] in after


def test_delete_removes_every_owned_object(control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "gone"
    kubectl_apply(control_plane, ns, manifest(name, replicas=1))
    wait_settled(api, ns, name, replicas=1)
    everything = owned(api, ns, name)
    assert all(everything[kind] for kind in (*OWNED_KINDS, "ReplicaSet", "Pod")), everything

    control_plane.kubectl("delete", "mxd", name, "-n", ns, "--wait=true", "--timeout=60s")

    def nothing_left():
        left = {kind: names for kind, names in owned(api, ns, name).items() if names}
        return not left or None

    try:
        wait_for(nothing_left, timeout=GONE_TIMEOUT, what="the garbage collector to remove every owned object")
    except AssertionError:
        raise AssertionError(f"left behind: {owned(api, ns, name)}") from None
    # ... and the operator does not bring any of it back.
    time.sleep(3)
    assert not any(owned(api, ns, name).values())


def test_a_handle_reaches_another_deployment_through_cluster_dns(control_plane, modelplex_operator,
                                                                  kube_namespace, api):
    ns = kube_namespace
    # echo lists caller: the caller's handle sends its own deployment's credential.
    kubectl_apply(control_plane, ns, manifest("echo", replicas=1, router={"callers": ["caller"]}))
    caller = manifest("caller", replicas=1, handler="mxd_handler:Caller")
    del caller["spec"]["batching"]
    caller["spec"]["env"].append({"name": "TARGET_DEPLOYMENT", "value": "echo"})
    kubectl_apply(control_plane, ns, caller)
    wait_settled(api, ns, "echo", replicas=1)
    wait_settled(api, ns, "caller", replicas=1)

    code, answer = predict(router_url(control_plane, ns, "caller"), "m7", {"hello": "world"})
    assert code == 200, answer
    assert answer["url"] == f"http://echo.{ns}.svc:8000"
    assert answer["caller"] == pods(api, ns, "caller")[0].metadata.name
    inner = answer["answer"]
    assert inner["model"] == "m7" and inner["echo"] == {"hello": "world"}
    assert inner["pod"] == pods(api, ns, "echo")[0].metadata.name
