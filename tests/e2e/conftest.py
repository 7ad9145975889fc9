"""End-to-end fixtures: a real one-node cluster (``modelplex_cluster.controlplane``): etcd,
kube-apiserver, kube-controller-manager, kube-scheduler built by hack/control-plane/build.sh,
and a node of Debian's containerd + runc, a CNI bridge, the kubelet, kube-proxy and CoreDNS.

    def test_something(control_plane, kube_namespace):
        core = kubernetes.client.CoreV1Api(control_plane.api_client())
        control_plane.kubectl("apply", "-n", kube_namespace, "-f", "crds/...")
        control_plane.env()                    # KUBECONFIG + PATH with kubectl/helm, for subprocesses
        control_plane.pod_log(kube_namespace, "my-pod")   # kubectl logs

Pods run from images on the node: ``e2e.busybox.BUSYBOX`` (made here from Debian's static busybox) for the
node's own tests, the project's images (``modelplex_cluster.images``) for the operator's.
Only one node runs on a machine: the session's starts on first use, and a test that needs the
machine to itself (``exclusive_node``) stops it and starts it again afterwards.

On a failing test the tails of the component logs, the pods and the last events are attached
to the report ("cluster logs" section).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from modelplex_cluster.controlplane import ControlPlane, build_binaries, clear_abandoned_node
from modelplex_cluster.testing import wait_for

from e2e.busybox import busybox_image

#: Held while a test session's node runs: two pytest runs on one machine take turns at it (a fixed
#: path, whatever cache folder each uses: the node's bridges and addresses are the machine's).
NODE_LOCK = Path("/run/lock" if Path("/run/lock").is_dir() else "/tmp") / "modelplex-e2e-node.lock"


class SessionCluster:
    """The session's cluster, started on first use; ``pause()`` hands the machine to another node."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.cp: ControlPlane | None = None
        self._lock: int | None = None

    def get(self) -> ControlPlane:
        if self.cp is None:
            self._take_machine()
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.state_dir.mkdir(parents=True)
            cp = ControlPlane(build_binaries(), state_dir=self.state_dir)
            try:
                cp.start()
                try:
                    cp.import_image(busybox_image())
                except BaseException:
                    cp.stop()
                    raise
            except BaseException:
                self.release_machine()
                raise
            self.cp = cp
        return self.cp

    def pause(self, *, keep_machine: bool = False) -> bool:
        """Stop the node; ``keep_machine``: other test sessions still wait (this one needs the
        machine without its node)."""
        if keep_machine:
            self._take_machine()
        if self.cp is None:
            return False
        try:
            self.cp.stop()
        finally:
            self.cp = None
            if not keep_machine:
                self.release_machine()
        return True

    def _take_machine(self) -> None:
        if self._lock is not None:
            return
        NODE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(NODE_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another test session's node on this machine ({NODE_LOCK})",
                  file=sys.stderr, flush=True)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        # With the machine ours, a node registered by a killed test run is gone for good: a test
        # that checks the host before its own node would otherwise find that node's leftovers.
        undone = clear_abandoned_node()
        if undone:
            print(f"undid what an abandoned node left on the host: {', '.join(undone)}", file=sys.stderr, flush=True)

    def release_machine(self) -> None:
        """Let another test session start its node."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


@pytest.fixture(scope="session")
def session_cluster(tmp_path_factory):
    cluster = SessionCluster(tmp_path_factory.mktemp("cluster") / "state")
    try:
        yield cluster
    finally:
        cluster.pause()
        cluster.release_machine()


@pytest.fixture(scope="session")
def control_plane(session_cluster) -> ControlPlane:
    """The running cluster (a :class:`modelplex_cluster.controlplane.ControlPlane`).

    ``.kubeconfig`` (admin), ``.server``, ``.bin_dir`` (kubectl, helm, ...), ``.env()``,
    ``.api_client()``, ``.kubectl(*args)``, ``.pod_log(ns, pod)``, ``.state_dir``.
    """
    return session_cluster.get()


@pytest.fixture
def exclusive_node(session_cluster):
    """No node of this session runs during the test (one node per machine); restarted on next use."""
    session_cluster.pause(keep_machine=True)
    yield


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
            report.sections.append(("cluster logs", cp.describe_logs(lines=25)))
        except Exception as exc:  # noqa: BLE001
            report.sections.append(("cluster logs", f"(could not read logs: {exc})"))


def pytest_collection_modifyitems(items):
    # The node is machine-wide: tests that need it to themselves run first, before the
    # session's node starts (they would pause it otherwise, and it would start again).
    items.sort(key=lambda item: 0 if "exclusive_node" in getattr(item, "fixturenames", ()) else 1)
