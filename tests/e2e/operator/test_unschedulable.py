"""A replica that asks for a GPU on a cluster without one stays Pending, as Ray's actor would,
and ``kubectl get mxd`` shows why: the ``PodsScheduled`` condition carries the scheduler's
message, the ``UNSCHEDULABLE`` column the resource no node has, and a Warning Event says it."""

from __future__ import annotations

import pytest

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import condition, get_mxd, kubectl_apply, manifest, pods, wait_event

pytestmark = pytest.mark.e2e


def test_a_replica_asking_for_a_gpu_no_node_has_stays_pending_and_kubectl_get_names_the_gpu(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "wants-gpu"
    kubectl_apply(control_plane, ns, manifest(name, replicas=1, resources={"limits": {"nvidia.com/gpu": 1}}))

    def unschedulable():
        obj = get_mxd(api, ns, name)
        return obj if condition(obj, "PodsScheduled").get("status") == "False" else None

    obj = wait_for(unschedulable, timeout=90, interval=0.5, what="PodsScheduled False")
    scheduled = condition(obj, "PodsScheduled")
    assert scheduled["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in scheduled["message"]
    assert obj["status"]["unschedulable"] == "nvidia.com/gpu"
    assert condition(obj, "Ready")["status"] == "False"
    assert [pod.status.phase for pod in pods(api, ns, name)] == ["Pending"]
    event = wait_event(api, ns, name, "Unschedulable", timeout=60)
    assert event[0] == "Warning" and "nvidia.com/gpu" in event[2]
    table = control_plane.kubectl("get", "mxd", name, "-n", ns).stdout.splitlines()
    assert "UNSCHEDULABLE" in table[0].split() and "nvidia.com/gpu" in table[1].split()
