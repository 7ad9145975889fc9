"""Credentials per deployment on the real node: with NetworkPolicies off (``mode: none``) nothing
but the credentials stands between two deployments of one namespace. A pod of A, with A's
credential, gets 401 from B's replica; A's handle reaches B's router only once B lists A as a
caller (``spec.router.callers``), and then only for the models B's globs give the client A."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import kubectl_apply, manifest, pods, predict, router_url, wait_settled

pytestmark = pytest.mark.e2e

#: Run in A's replica pod, with the environment its container has: B's replica's API with A's
#: own credential (the file the operator mounted), and with none.
WITH_OWN_CREDENTIAL = """
import os, sys, urllib.error, urllib.request
token = open(os.environ["MODELPLEX_INTERNAL_TOKEN_FILE"]).read().strip()
for headers in ({"X-Modelplex-Internal-Token": token}, {}):
    try:
        print("status", urllib.request.urlopen(urllib.request.Request(sys.argv[1], headers=headers), timeout=10).status)
    except urllib.error.HTTPError as e:
        print("status", e.code)
"""


def test_a_deployment_s_credential_opens_another_s_router_only_as_its_listed_caller_within_its_globs(
        control_plane, modelplex_operator, kube_namespace, api):
    ns = kube_namespace
    core = client.CoreV1Api(api)
    core.create_namespaced_secret(ns, {"metadata": {"name": "b-clients"}, "stringData": {"alice": "alice-token"}})
    open_ = {"networkPolicy": {"mode": "none"}}
    b_router = {"auth": {"secretRef": {"name": "b-clients"}, "models": {"a": ["public-*"]}}}
    kubectl_apply(control_plane, ns, manifest("b", replicas=1, router=b_router, **open_))
    caller = manifest("a", replicas=1, handler="mxd_handler:Caller", **open_)
    del caller["spec"]["batching"]
    caller["spec"]["env"].append({"name": "TARGET_DEPLOYMENT", "value": "b"})
    kubectl_apply(control_plane, ns, caller)
    wait_settled(api, ns, "b", replicas=1)
    wait_settled(api, ns, "a", replicas=1)

    # Each deployment has its own Secret; neither token is the other's.
    tokens = {name: base64.b64decode(core.read_namespaced_secret(f"{name}-internal", ns).data["token"]).decode()
              for name in ("a", "b")}
    assert tokens["a"] != tokens["b"] and all(len(token) >= 40 for token in tokens.values())

    # A pod running A's image with A's credential: 401 from B's replica, as without any.
    (a_replica,) = pods(api, ns, "a")
    (b_replica,) = pods(api, ns, "b")
    out = control_plane.kubectl("exec", "-n", ns, a_replica.metadata.name, "--", "python3", "-c",
                                WITH_OWN_CREDENTIAL, f"http://{b_replica.status.pod_ip}:9000/v1/models",
                                timeout=60).stdout
    assert out.split() == ["status", "401", "status", "401"], out

    # A's handle to B's router: a method call with A's credential, which B does not list: 403.
    a_url = router_url(control_plane, ns, "a")
    status, answer = predict(a_url, "public-1", {"x": 1})
    assert status == 403 and answer["error"]["code"] == "forbidden", answer

    # B lists A: A's handle works for the models B's globs give the client "a", and no other.
    kubectl_apply(control_plane, ns, manifest("b", replicas=1, router={**b_router, "callers": ["a"]}, **open_))

    def through() -> tuple[int, object] | None:
        status, answer = predict(a_url, "public-1", {"x": 2})
        return (status, answer) if status == 200 else None

    status, answer = wait_for(through, timeout=240, what="A's handle reaching B once B lists A")
    assert answer["answer"]["model"] == "public-1" and answer["answer"]["echo"] == {"x": 2}
    status, answer = predict(a_url, "private-1", {"x": 3})
    assert status == 403 and "'a'" in answer["error"]["message"] and "private-1" in answer["error"]["message"], answer

    # The tokens never show in an answer or the operator's Events.
    events = core.list_namespaced_event(ns).items
    assert not any(token in (event.message or "") for event in events for token in tokens.values())
    assert not any(token in json.dumps(answer) for token in tokens.values())
