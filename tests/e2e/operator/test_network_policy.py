"""The operator's NetworkPolicies enforced on the real node (its policy agent, kube-router's
firewall): with ``spec.networkPolicy.mode: replicas`` a pod that is not one of the deployment's
routers cannot reach a replica's port while the router still serves; with ``none`` it can."""

from __future__ import annotations

import pytest
from kubernetes import client

from modelplex_cluster.testing import http_get, wait_for

from e2e.operator.helpers import E2E_REPLICA_IMAGE, kubectl_apply, manifest, pods, predict, router_url, wait_settled

pytestmark = pytest.mark.e2e

#: Run in the outsider pod: one GET of the replica's probe (open to anyone the policy lets through).
REACH = """
import sys, urllib.error, urllib.request
try:
    print("status", urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print("status", e.code)
except OSError as e:
    print("blocked", type(getattr(e, "reason", e)).__name__)
"""


def outsider_pod(name: str) -> dict:
    """A pod of the replica image (for its Python) that belongs to no deployment."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "main", "image": E2E_REPLICA_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["python3", "-c", "import time; time.sleep(3600)"],
                                     "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}]}}


def test_a_pod_that_is_not_a_router_reaches_a_replica_only_when_the_policy_mode_is_none(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "fenced"
    kubectl_apply(control_plane, ns, manifest(name, replicas=1))  # networkPolicy.mode: replicas (the default)
    kubectl_apply(control_plane, ns, outsider_pod("outsider"))
    wait_settled(api, ns, name, replicas=1)
    core = client.CoreV1Api(api)
    wait_for(lambda: core.read_namespaced_pod("outsider", ns).status.phase == "Running", timeout=120,
             what="the outsider pod running")
    (replica,) = pods(api, ns, name)
    probe = f"http://{replica.status.pod_ip}:9000/readyz"
    control_probe = f"http://{replica.status.pod_ip}:9001/readyz"  # the kubelet's port

    def reach(url: str = probe) -> str:
        return control_plane.kubectl("exec", "-n", ns, "outsider", "--", "python3", "-c", REACH, url,
                                     timeout=60).stdout.strip()

    def blocked() -> str | None:
        out = reach()
        return out if out.startswith("blocked") else None

    # The policy agent syncs within seconds of the policy and the pods appearing.
    answer = wait_for(blocked, timeout=90, what="the outsider blocked from the replica")
    assert answer in ("blocked ConnectionRefusedError", "blocked TimeoutError", "blocked timeout"), answer
    assert http_get(probe)[0] == 200  # the replica does serve: from the node, which every policy lets in
    # The control port too: open to the node (the kubelet's probes), closed to the outsider (no
    # scrapers named).
    assert http_get(control_probe)[0] == 200
    assert reach(control_probe).startswith("blocked")
    # ... while the router, which the policy lets in, still serves through the replica.
    url = router_url(control_plane, ns, name)
    assert predict(url, "m1", {"x": 1})[0] == 200
    assert reach().startswith("blocked")  # still fenced after the router's traffic

    # mode none: the operator rewrites the replicas' policy to allow all, and the agent follows.
    kubectl_apply(control_plane, ns, manifest(name, replicas=1, networkPolicy={"mode": "none"}))
    assert wait_for(lambda: reach() == "status 200" or None, timeout=90, what="the outsider reaching the replica")
    assert predict(url, "m2", {"x": 2})[0] == 200
