"""End-to-end fixtures: a real control plane (etcd, kube-apiserver,
kube-controller-manager) built by hack/control-plane/build.sh, and the test
kubelet that runs pods as local processes on 127.N.x.y.

    def test_something(control_plane, kube_namespace):
        core = kubernetes.client.CoreV1Api(control_plane.api_client())
        control_plane.kubectl("apply", "-n", kube_namespace, "-f", "crds/...")
        control_plane.env()                    # KUBECONFIG + PATH with kubectl/helm, for subprocesses
        control_plane.pod_log(kube_namespace, "my-pod")   # what the pod's process printed

On a failing test the tails of the component logs and pod logs are attached to
the report ("control plane logs" section).
"""

from __future__ import annotations

import os
import uuid

import pytest

from modelplex_cluster.controlplane import ControlPlane, build_binaries
from modelplex_cluster.testing import wait_for


def _pod_ip_prefix() -> str:
    # Not 127.0 (that is `modelplex cluster up`'s); per run so two sessions do not collide.
    return os.environ.get("MODELPLEX_E2E_POD_IP_PREFIX") or f"127.{20 + os.getpid() % 200}"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """The running control plane (a :class:`modelplex_cluster.controlplane.ControlPlane`).

    ``.kubeconfig`` (admin), ``.server``, ``.bin_dir`` (kubectl, helm, ...),
    ``.env()``, ``.api_client()``, ``.kubectl(*args)``, ``.pod_log(ns, pod)``,
    ``.pod_log_path(ns, pod)``, ``.pod_processes()``, ``.state_dir``.
    Pod processes run with cwd = the repository root.
    """
    bin_dir = build_binaries()
    cp = ControlPlane(bin_dir, state_dir=tmp_path_factory.mktemp("control-plane"), pod_ip_prefix=_pod_ip_prefix())
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def kube_namespace(control_plane):
    """A fresh namespace (with its ``default`` ServiceAccount), deleted after the test."""
    from kubernetes import client

    name = f"e2e-{uuid.uuid4().hex[:8]}"
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), timeout=60,
             what=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except client.ApiException:
            pass
        api.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "control_plane" in getattr(item, "funcargs", {}):
        cp = item.funcargs["control_plane"]
        try:
            report.sections.append(("control plane logs", cp.describe_logs(lines=25)))
        except Exception as exc:  # noqa: BLE001
            report.sections.append(("control plane logs", f"(could not read logs: {exc})"))
