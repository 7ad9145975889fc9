"""The operator installed by its Helm chart on the real node, from the project's images.

``project_images`` (session): the project's images (``modelplex_cluster.images``, built or
reused by content hash) on the node under the chart's default tags, and the replica image with
this folder's ``mxd_handler.py`` in it (``E2E_REPLICA_IMAGE``, one layer more, made on the node).
``modelplex_operator`` (session): ``helm install`` of ``charts/modelplex`` with its default
values into its own namespace, watching every namespace. The operator runs in its container on
in-cluster config (the chart's ServiceAccount token, mounted by the kubelet), so the chart's
RBAC is what it really gets.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pytest
from kubernetes import client

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import CHART, E2E_HANDLER_DIR, E2E_REPLICA_IMAGE, HERE, METRICS_FROM, READY_TIMEOUT


@dataclass
class OperatorRelease:
    release: str
    namespace: str
    deployment: str  # the operator's Deployment (also its ClusterRole's name)

    def pod(self, api_client):
        pods = client.CoreV1Api(api_client).list_namespaced_pod(
            self.namespace, label_selector=f"app.kubernetes.io/instance={self.release},"
                                           "app.kubernetes.io/component=operator").items
        live = [p for p in pods if not p.metadata.deletion_timestamp]
        return live[0] if len(live) == 1 else None

    def wait_ready(self, api_client, timeout: float = READY_TIMEOUT):
        def ready():
            pod = self.pod(api_client)
            if pod is not None and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()):
                return pod
            return None

        return wait_for(ready, timeout=timeout, what=f"the operator pod in {self.namespace} Ready")


def helm(cp, *args: str, timeout: float = 300):
    import subprocess

    proc = subprocess.run([str(cp.bin_dir / "helm"), *args], capture_output=True, text=True, env=cp.env(),
                          timeout=timeout)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def project_images(control_plane):
    """component -> image tag, all on the node; the e2e replica image too."""
    from modelplex_cluster import node
    from modelplex_cluster.command import load_project_images

    socket = control_plane.containerd_socket
    tags = load_project_images(socket)
    # What `FROM replica` + `COPY mxd_handler.py` would build, made on the node itself: only the new
    # layer travels (a docker save | ctr import streams the replica's 4.6 GB again, minutes).
    node.derive_image(socket, tags["replica"], E2E_REPLICA_IMAGE,
                      {f"{E2E_HANDLER_DIR.lstrip('/')}/mxd_handler.py": ((HERE / "mxd_handler.py").read_bytes(), 0o644)})
    return tags


@pytest.fixture(scope="session")
def modelplex_operator(control_plane, project_images):
    namespace = f"modelplex-system-{uuid.uuid4().hex[:6]}"
    release = "modelplex"
    helm(control_plane, "install", release, str(CHART), "--namespace", namespace, "--create-namespace",
         "--wait", "--timeout", f"{READY_TIMEOUT}s", "--set", "logLevel=debug",
         # Scrapers (test_network_policy's, in a namespace of their own) on the control ports only.
         "--set-json", f"networkPolicy.metricsFrom={json.dumps(METRICS_FROM)}")
    op = OperatorRelease(release, namespace, deployment="modelplex")
    api = control_plane.api_client()
    try:
        op.wait_ready(api)
        yield op
    finally:
        try:
            helm(control_plane, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
            client.CoreV1Api(api).delete_namespace(namespace)
        except Exception:  # noqa: BLE001 - the control plane goes away at the session's end anyway
            pass
        api.close()


@pytest.fixture
def api(control_plane):
    api_client = control_plane.api_client()
    try:
        yield api_client
    finally:
        api_client.close()
