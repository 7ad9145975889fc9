"""The trust boundary on the real node: the router's door, the replicas' internal credential,
the operator's Secret and NetworkPolicies, pods as the restricted Pod Security Standard asks."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from e2e.operator.helpers import kubectl_apply, manifest, pods, predict, router_url, wait_settled

pytestmark = pytest.mark.e2e

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(url: str, *, method: str = "POST", body: bytes = b"{}", headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body if method != "GET" else None, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with NO_PROXY.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_default_deployment_keeps_model_control_and_method_calls_inside(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "guarded"
    kubectl_apply(control_plane, ns, manifest(name, replicas=1))
    wait_settled(api, ns, name, replicas=1)
    url = router_url(control_plane, ns, name)

    assert predict(url, "m1", {"x": 1})[0] == 200
    status, answer = call(url + "/v2/repository/models/m1/unload")
    assert status == 403 and "modelControl" in answer["error"]
    envelope = json.dumps({"method": "__call__", "args": [{"x": 2}], "kwargs": {}}).encode()
    status, answer = call(url + "/", body=envelope, headers={
        "Content-Type": "application/x-modelplex-call", "serve_multiplexed_model_id": "m1"})
    assert status == 403 and answer["error"]["code"] == "forbidden"
    (replica,) = pods(api, ns, name)

    # The replica's API answers nobody without the namespace's credential: not this host, not
    # another pod (the router pod, through its own Python, without the token).
    replica_url = f"http://{replica.status.pod_ip}:9000"
    assert call(replica_url + "/v1/models", method="GET")[0] == 401
    (router,) = pods(api, ns, name, role="router")[:1]
    script = ("import urllib.request, urllib.error\n"
              f"try: urllib.request.urlopen('{replica_url}/v1/models', timeout=10)\n"
              "except urllib.error.HTTPError as e: print('status', e.code)\n")
    out = control_plane.kubectl("exec", "-n", ns, router.metadata.name, "--", "python3", "-c", script).stdout
    assert "status 401" in out, out
    assert call(replica_url + "/readyz", method="GET")[0] == 200  # probes stay open

    # The credential: one Secret for the namespace, made and owned by the operator, mounted read-only.
    core = client.CoreV1Api(api)
    secret = core.read_namespaced_secret("modelplex-internal", ns)
    assert [ref.name for ref in secret.metadata.owner_references] == [name]
    token = base64.b64decode(secret.data["token"]).decode()
    assert len(token) >= 40
    status, held = call(replica_url + "/v1/models", method="GET", headers={"X-Modelplex-Internal-Token": token})
    assert status == 200 and "m1" in held["models"]  # the unload through the router never reached it

    # NetworkPolicies: the replicas' port for their routers and the operator only.
    policies = client.NetworkingV1Api(api).list_namespaced_network_policy(ns).items
    assert sorted(p.metadata.name for p in policies) == [f"{name}-replica", f"{name}-router"]

    # Every pod of the deployment as the restricted Pod Security Standard asks.
    for pod in pods(api, ns, name) + pods(api, ns, name, role="router"):
        assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
        assert pod.spec.security_context.run_as_non_root is True
        (container,) = pod.spec.containers
        assert container.security_context.allow_privilege_escalation is False
        assert container.security_context.capabilities.drop == ["ALL"]
