"""Helpers of the operator's end-to-end tests (imported as ``e2e.operator.helpers``).

Reads go through the ``kubernetes`` client with admin rights; what a user would type
(``kubectl apply``, ``scale``, ``patch``, ``delete``, ``helm install``) goes through the
binaries the control-plane script built.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from modelplex.wire.names import API_GROUP, API_VERSION, KIND, LABEL_DEPLOYMENT, LABEL_ROLE, PLURAL
from modelplex_cluster.testing import wait_for

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
CHART = REPO / "charts" / "modelplex"
CRD = REPO / "crds" / "multiplexeddeployments.modelplex.io.yaml"
#: Containers start on two busy cores: be generous, every wait is still bounded.
READY_TIMEOUT = 240
GONE_TIMEOUT = 180

OWNED_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Deployment")
#: The replica image with ``mxd_handler.py`` in it (built by conftest.py from the project's replica image).
# Not :latest, whose default pull policy is Always (nothing can be pulled here).
E2E_REPLICA_IMAGE = "modelplex.local/replica-e2e:1"
E2E_HANDLER_DIR = "/opt/modelplex-e2e"
#: The scrapers the operator's NetworkPolicies admit on control ports (the chart's
#: ``networkPolicy.metricsFrom``, set by conftest.py): pods so labelled in namespaces so labelled.
SCRAPER_NAMESPACE_LABELS = {"modelplex-e2e/monitoring": "true"}
SCRAPER_POD_LABELS = {"modelplex-e2e/scraper": "true"}
METRICS_FROM = [{"namespaceSelector": {"matchLabels": SCRAPER_NAMESPACE_LABELS},
                 "podSelector": {"matchLabels": SCRAPER_POD_LABELS}}]


def manifest(name: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    """A MultiplexedDeployment of the test handler (``mxd_handler.py`` beside this file)."""
    base: dict[str, Any] = {
        "replicas": replicas,
        "image": E2E_REPLICA_IMAGE,
        "handler": "mxd_handler:Echo",
        "batching": {"maxBatchSize": 4, "batchWaitTimeoutMs": 5},
        "env": [{"name": "PYTHONPATH", "value": E2E_HANDLER_DIR}],
    }
    base.update(spec)
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": name}, "spec": base}


def kubectl_apply(cp, namespace: str, doc: dict[str, Any], check: bool = True):
    return cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=check)


def get_mxd(api_client, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, PLURAL, name)


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == ctype:
            return cond
    return {}


def settled(obj: dict[str, Any], replicas: int) -> bool:
    """The operator acted on the current generation, every pod is ready, nothing is rolling."""
    status = obj.get("status") or {}
    return (
        status.get("observedGeneration") == obj["metadata"]["generation"]
        and condition(obj, "Ready").get("status") == "True"
        and condition(obj, "Progressing").get("status") == "False"
        and condition(obj, "Degraded").get("status") == "False"
        and status.get("readyReplicas") == replicas
        and status.get("replicas") == replicas
    )


def wait_settled(api_client, namespace: str, name: str, replicas: int, timeout: float = READY_TIMEOUT):
    last: dict[str, Any] = {}

    def check():
        nonlocal last
        last = get_mxd(api_client, namespace, name)
        return last if settled(last, replicas) else None

    try:
        return wait_for(check, timeout=timeout, interval=0.5,
                        what=f"MultiplexedDeployment {namespace}/{name} Ready with {replicas} replicas")
    except AssertionError as error:
        raise AssertionError(f"{error}\nlast status: {json.dumps(last.get('status'), indent=1)}") from None


def pods(api_client, namespace: str, name: str, role: str = "replica", live_only: bool = True) -> list:
    items = client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=f"{LABEL_DEPLOYMENT}={name},{LABEL_ROLE}={role}").items
    return [p for p in items if not (live_only and p.metadata.deletion_timestamp)]


def router_url(cp, namespace: str, name: str) -> str:
    """The router through its Service ``name``: the ClusterIP (kube-proxy's rules), once the
    Service has a ready endpoint and kube-proxy has programmed it (until then a ClusterIP with no
    endpoints in its rules refuses connections)."""
    api_client = cp.api_client()
    try:
        core, discovery = client.CoreV1Api(api_client), client.DiscoveryV1Api(api_client)

        def ready_endpoint():
            slices = discovery.list_namespaced_endpoint_slice(
                namespace, label_selector=f"kubernetes.io/service-name={name}").items
            return any(e.conditions.ready for s in slices for e in s.endpoints or ())

        wait_for(ready_endpoint, timeout=READY_TIMEOUT, what=f"a ready endpoint of Service {namespace}/{name}")
        svc = core.read_namespaced_service(name, namespace)
        address = (svc.spec.cluster_ip, svc.spec.ports[0].port)

        def accepts():
            with socket.create_connection(address, timeout=2):
                return True

        wait_for(accepts, timeout=READY_TIMEOUT, what=f"Service {namespace}/{name} accepting at {address[0]}:{address[1]}")
        return f"http://{address[0]}:{address[1]}"
    finally:
        api_client.close()


def predict(url: str, model: str, body: Any, timeout: float = 30) -> tuple[int, Any]:
    """POST ``body`` as JSON to the router for ``model``; returns (status, parsed answer)."""
    request = urllib.request.Request(
        url + "/", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "serve_multiplexed_model_id": model},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, raw.decode(errors="replace")


def loaded_models(pod) -> int:
    """How many models the pod's replica holds, from its annotation (a fixed-size summary)."""
    raw = (pod.metadata.annotations or {}).get("modelplex.io/loaded-models")
    return int(json.loads(raw).get("models") or 0) if raw else 0


def owned(api_client, namespace: str, name: str) -> dict[str, list[str]]:
    """Every object labelled as made for ``name``, by kind (sorted names)."""
    selector = f"{LABEL_DEPLOYMENT}={name}"
    core, apps, rbac = client.CoreV1Api(api_client), client.AppsV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    listers = {
        "ServiceAccount": core.list_namespaced_service_account,
        "Role": rbac.list_namespaced_role,
        "RoleBinding": rbac.list_namespaced_role_binding,
        "ConfigMap": core.list_namespaced_config_map,
        "Service": core.list_namespaced_service,
        "Deployment": apps.list_namespaced_deployment,
        "ReplicaSet": apps.list_namespaced_replica_set,
        "Pod": core.list_namespaced_pod,
    }
    return {kind: sorted(o.metadata.name for o in lister(namespace, label_selector=selector).items)
            for kind, lister in listers.items()}


def expected_objects(name: str) -> dict[str, list[str]]:
    return {
        "ServiceAccount": sorted([f"{name}-replica", f"{name}-router"]),
        "Role": sorted([f"{name}-replica", f"{name}-router"]),
        "RoleBinding": sorted([f"{name}-replica", f"{name}-router"]),
        "ConfigMap": [f"{name}-spec"],
        "Service": [name],
        "Deployment": sorted([f"{name}-replica", f"{name}-router"]),
    }


def events_of(api_client, namespace: str, name: str) -> list[tuple[str, str, str]]:
    items = client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind={KIND}").items
    return [(e.type, e.reason, e.message or "") for e in items]


def wait_event(api_client, namespace: str, name: str, reason: str, timeout: float = 60) -> tuple[str, str, str]:
    return wait_for(
        lambda: next((e for e in events_of(api_client, namespace, name) if e[1] == reason), None),
        timeout=timeout, what=f"an Event {reason} on {namespace}/{name}",
    )
