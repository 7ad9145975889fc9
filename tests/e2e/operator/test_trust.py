"""The trust boundary on the real node: the router's door, the replicas' internal credential,
the operator's Secret and NetworkPolicies, what the replicas' and routers' ServiceAccount tokens
may do (RBAC and the chart's admission policy), pods in a namespace enforcing the restricted Pod
Security Standard, a same-named object the operator did not make left alone."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import (E2E_REPLICA_IMAGE, condition, get_mxd, kubectl_apply, loaded_models, manifest, pods,
                                  predict, router_url, wait_event, wait_settled)

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

    # The credential: one Secret for the deployment, made and controlled by the operator, mounted read-only.
    core = client.CoreV1Api(api)
    secret = core.read_namespaced_secret(f"{name}-internal", ns)
    assert [(ref.name, ref.controller) for ref in secret.metadata.owner_references] == [(name, True)]
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


#: Run inside a replica pod with its own ServiceAccount token: what the API lets that token do.
TOKEN_PROBE = """
import json, sys
from kubernetes import client, config
config.load_incluster_config()
api = client.CoreV1Api()
ns, own, other, held = sys.argv[1:5]
def attempt(what, call):
    try:
        call()
        print(what, 200)
    except client.ApiException as error:
        print(what, error.status)
def annotate(pod, key, value):
    return lambda: api.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {key: value}}})
attempt("own-loaded-models", annotate(own, "modelplex.io/loaded-models", held))
attempt("own-other-annotation", annotate(own, "example.com/note", "x"))
attempt("own-label", lambda: api.patch_namespaced_pod(own, ns, {"metadata": {"labels": {"example.com/x": "y"}}}))
attempt("own-spec", lambda: api.patch_namespaced_pod(own, ns, {"spec": {"activeDeadlineSeconds": 5}}))
attempt("other-loaded-models", annotate(other, "modelplex.io/loaded-models", held))
attempt("read-pod", lambda: api.read_namespaced_pod(other, ns))
attempt("read-secret", lambda: api.read_namespaced_secret(sys.argv[5], ns))
attempt("list-secrets", lambda: api.list_namespaced_secret(ns))
"""


def can_i(cp, namespace: str, account: str, verb: str, resource: str) -> str:
    """``kubectl auth can-i`` for a ServiceAccount of ``namespace``: "yes" or "no"."""
    answer = cp.kubectl("auth", "can-i", verb, resource, "-n", namespace,
                        "--as", f"system:serviceaccount:{namespace}:{account}", check=False)
    return answer.stdout.strip()


def test_a_replica_s_token_changes_only_its_own_pod_s_annotation_and_the_router_s_only_reads(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "scoped"
    kubectl_apply(control_plane, ns, manifest(name, replicas=1))
    wait_settled(api, ns, name, replicas=1)
    assert predict(router_url(control_plane, ns, name), "m1", {"x": 1})[0] == 200
    # The replica reported the load through its pod annotation, under the admission policy.
    wait_for(lambda: loaded_models(pods(api, ns, name)[0]) == 1, timeout=60, what="m1 in the replica's annotation")
    (replica,) = pods(api, ns, name)
    router = pods(api, ns, name, role="router")[0]
    held = replica.metadata.annotations["modelplex.io/loaded-models"]

    out = control_plane.kubectl("exec", "-n", ns, replica.metadata.name, "--", "python3", "-c", TOKEN_PROBE,
                                ns, replica.metadata.name, router.metadata.name, held, f"{name}-internal").stdout
    answers = dict(line.split() for line in out.splitlines() if line.strip())
    assert answers == {
        "own-loaded-models": "200",  # what a replica does
        "own-other-annotation": "403", "own-label": "403", "own-spec": "403",  # the policy: nothing else
        "other-loaded-models": "403",  # the policy: not another pod
        "read-pod": "403", "read-secret": "403", "list-secrets": "403",  # RBAC: reads nothing
    }, out
    after = client.CoreV1Api(api).read_namespaced_pod(router.metadata.name, ns)
    assert "modelplex.io/loaded-models" not in (after.metadata.annotations or {})

    # The router's ServiceAccount only reads pods.
    router_sa = f"{name}-router"
    for verb in ("get", "list", "watch"):
        assert can_i(control_plane, ns, router_sa, verb, "pods") == "yes", verb
    for verb, resource in (("patch", "pods"), ("create", "pods"), ("update", "pods"), ("delete", "pods"),
                           ("create", "pods/exec"), ("get", "secrets"), ("patch", "deployments")):
        assert can_i(control_plane, ns, router_sa, verb, resource) == "no", (verb, resource)
    assert can_i(control_plane, ns, f"{name}-replica", "patch", "pods") == "yes"  # narrowed by the policy
    assert can_i(control_plane, ns, f"{name}-replica", "get", "pods") == "no"


def test_a_deployment_comes_up_and_serves_in_a_namespace_enforcing_the_restricted_standard(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "restricted"
    client.CoreV1Api(api).patch_namespace(ns, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    # The apiserver's PodSecurity admission does enforce it here: a pod without seccompProfile is refused.
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"},
            "spec": {"containers": [{"name": "c", "image": E2E_REPLICA_IMAGE}]}}
    refused = kubectl_apply(control_plane, ns, bare, check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr

    kubectl_apply(control_plane, ns, manifest(name, replicas=1))
    wait_settled(api, ns, name, replicas=1)
    assert predict(router_url(control_plane, ns, name), "m1", {"x": 1})[0] == 200


def test_a_same_named_object_the_operator_did_not_make_is_left_alone_and_reported(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "taken"
    core = client.CoreV1Api(api)
    theirs = core.create_namespaced_config_map(ns, {"metadata": {"name": f"{name}-spec", "labels": {"team": "theirs"}},
                                                    "data": {"spec.yaml": "theirs"}})
    kubectl_apply(control_plane, ns, manifest(name, replicas=1))
    etype, _, message = wait_event(api, ns, name, "ObjectConflict")
    assert etype == "Warning" and f"ConfigMap {name}-spec exists and was not made by Modelplex" in message
    wait_for(lambda: condition(get_mxd(api, ns, name), "Degraded").get("reason") == "ObjectConflict", timeout=60,
             what="Degraded/ObjectConflict")
    after = core.read_namespaced_config_map(f"{name}-spec", ns)
    assert after.data == {"spec.yaml": "theirs"} and not after.metadata.owner_references
    assert after.metadata.resource_version == theirs.metadata.resource_version  # not written at all
