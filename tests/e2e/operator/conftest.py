"""The operator installed by its Helm chart on the real control plane.

``modelplex_operator`` (session): ``helm install`` of ``charts/modelplex`` into its own
namespace, watching every namespace. The test kubelet runs the operator pod like any other:
its container command ``modelplex operator`` runs as a local process with a kubeconfig holding
the token of the chart's ServiceAccount, so the chart's RBAC is what the operator really gets.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from kubernetes import client

from e2e.operator.helpers import CHART, READY_TIMEOUT
from modelplex_cluster.testing import wait_for


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
def modelplex_operator(control_plane):
    namespace = f"modelplex-system-{uuid.uuid4().hex[:6]}"
    release = "modelplex"
    helm(control_plane, "install", release, str(CHART), "--namespace", namespace, "--create-namespace",
         "--wait", "--timeout", f"{READY_TIMEOUT}s", "--set", "logLevel=debug")
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
