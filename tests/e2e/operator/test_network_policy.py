"""The operator's NetworkPolicies enforced on the real node (its policy agent, kube-router's
firewall): with ``spec.networkPolicy.mode: replicas`` a pod that is not one of the deployment's
routers cannot reach a replica's port while the router still serves; with ``none`` it can. A
scraper the chart names (``networkPolicy.metricsFrom``) reads a router's and a replica's metrics
on the port and path of the chart's PodMonitor, on the control ports only, and the kubelet probes
those ports."""

from __future__ import annotations

import subprocess
import uuid

import pytest
import yaml
from kubernetes import client

from modelplex_cluster.testing import http_get, wait_for

from e2e.operator.helpers import (CHART, E2E_REPLICA_IMAGE, SCRAPER_NAMESPACE_LABELS, SCRAPER_POD_LABELS, kubectl_apply,
                                  manifest, pods, predict, router_url, wait_settled)

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
    # The control port too: open to the node (the kubelet's probes), closed to the outsider (not a
    # scraper the chart names).
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


#: Run in the scraper pod: one GET, its status and how many samples of the given prefix it holds.
SCRAPE = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as answer:
        body = answer.read().decode()
    print("status", answer.status, "samples", sum(line.startswith(sys.argv[2]) for line in body.splitlines()))
except urllib.error.HTTPError as e:
    print("status", e.code)
except OSError as e:
    print("blocked", type(getattr(e, "reason", e)).__name__)
"""


def pod_monitor_endpoint(control_plane) -> tuple[str, str]:
    """The port name and path the chart's PodMonitor scrapes (``helm template`` with it on)."""
    # helm template assumes an old server unless told (the chart needs 1.25+): the node's version.
    rendered = subprocess.run([str(control_plane.bin_dir / "helm"), "template", "mx", str(CHART), "--kube-version",
                               "1.33.0", "--set", "monitoring.podMonitor.enabled=true",
                               "--show-only", "templates/monitoring.yaml"],
                              capture_output=True, text=True, timeout=120, check=True).stdout
    (monitor,) = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "PodMonitor"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    return endpoint["port"], endpoint["path"]


def port_named(pod, name: str) -> int:
    return next(p.container_port for c in pod.spec.containers for p in c.ports or () if p.name == name)


def test_a_scraper_reads_router_and_replica_metrics_on_the_pod_monitor_s_port_only_and_the_kubelet_probes_it(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "scraped"
    core = client.CoreV1Api(api)
    # strict: the router's policy is enforced too (its namespace's pods, and the scrapers on its control port).
    kubectl_apply(control_plane, ns, manifest(name, replicas=1, networkPolicy={"mode": "strict"}))
    # The scraper, as Prometheus would be: a pod of its own namespace that the chart's metricsFrom names.
    monitoring = f"e2e-monitoring-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": monitoring, "labels": dict(SCRAPER_NAMESPACE_LABELS)}})
    try:
        wait_for(lambda: core.read_namespaced_service_account("default", monitoring), timeout=60,
                 what=f"ServiceAccount {monitoring}/default")
        scraper = outsider_pod("scraper")
        scraper["metadata"]["labels"].update(SCRAPER_POD_LABELS)
        kubectl_apply(control_plane, monitoring, scraper)
        wait_settled(api, ns, name, replicas=1)
        wait_for(lambda: core.read_namespaced_pod("scraper", monitoring).status.phase == "Running", timeout=120,
                 what="the scraper pod running")
        port_name, path = pod_monitor_endpoint(control_plane)
        assert port_name == "control" and path == "/metrics"

        def scrape(url: str, prefix: str = "modelplex_") -> str:
            return control_plane.kubectl("exec", "-n", monitoring, "scraper", "--", "python3", "-c", SCRAPE, url,
                                         prefix, timeout=60).stdout.strip()

        (replica,) = pods(api, ns, name)
        routers = pods(api, ns, name, role="router")
        assert routers
        for pod, prefix in ((replica, "modelplex_replica_"), (routers[0], "modelplex_router_")):
            url = f"http://{pod.status.pod_ip}:{port_named(pod, port_name)}{path}"

            def scraped(url: str = url, prefix: str = prefix) -> str | None:
                out = scrape(url, prefix)
                return out if out.startswith("status 200 samples") and not out.endswith(" 0") else None

            wait_for(scraped, timeout=90, what=f"the scraper reading {url}")
            # The kubelet probes the control port, and the pod is Ready by it.
            container = pod.spec.containers[0]
            assert container.readiness_probe.http_get.port == "control"
            assert container.liveness_probe.http_get.port == "control"
            live = core.read_namespaced_pod(pod.metadata.name, ns)
            assert any(c.type == "Ready" and c.status == "True" for c in live.status.conditions or ())
        # Scrapers are admitted on the control ports only: not the replica's API, nor (strict) the router's public port.
        for url in (f"http://{replica.status.pod_ip}:9000/readyz",
                    f"http://{routers[0].status.pod_ip}:{port_named(routers[0], 'http')}/readyz"):
            assert scrape(url).startswith("blocked"), url
    finally:
        core.delete_namespace(monitoring)
