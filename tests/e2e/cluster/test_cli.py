"""``modelplex cluster up|status|load|down``: a node comes up, answers, and ``down`` leaves the
machine exactly as it found it (iptables v4 and v6, sysctls, links, netns, mounts, cgroups)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from modelplex_cluster import node
from modelplex_cluster.controlplane import containerd_root
from modelplex_cluster.testing import pid_alive, wait_for

from e2e.busybox import busybox_image

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


def cli(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelplex_cluster", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def short_dir():
    """A short folder, as the default ~/.cache/modelplex/cluster is: the kubelet puts unix sockets
    under the cluster's folder, and a socket's path may not pass 107 bytes (pytest's come close)."""
    folder = Path(tempfile.mkdtemp(prefix="mpx-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_cluster_up_status_and_down_restores_the_host(exclusive_node, tmp_path, short_dir):
    state = short_dir / "cluster"
    env = dict(os.environ)
    env["MODELPLEX_CLUSTER_DIR"] = str(state)
    env.pop("KUBECONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "cluster"), env.get("PYTHONPATH")]))
    before = node.snapshot_host()
    assert not before["kube_iptables"], "KUBE-* iptables rules exist before the test: another node runs here?"
    # A pod of the busybox image, which `up` does not know about: it goes on the node through
    # containerd's content store, as `cluster load` puts docker's images there.
    (tmp_path / "busybox.tar").write_bytes(busybox_image())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
               "name": "main", "image": "modelplex.local/busybox:e2e", "imagePullPolicy": "Never",
               "command": ["sleep", "600"]}]}}
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    # A NetworkPolicy for it, so that the policy agent makes its ipsets too (which `down` removes).
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "fence"},
              "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "friend"}}}]}]}}
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    py = shlex.quote(sys.executable)
    script = f"""
        set -euo pipefail
        eval "$({py} -m modelplex_cluster up --no-images)"
        echo "KUBECONFIG=$KUBECONFIG"
        echo "KUBECTL=$(command -v kubectl)"
        echo "HELM=$(command -v helm)"
        ctr --address {shlex.quote(str(state / 'containerd' / 'containerd.sock'))} -n k8s.io images import \\
            {shlex.quote(str(tmp_path / 'busybox.tar'))} >/dev/null
        kubectl get nodes -o wide
        kubectl apply -f {shlex.quote(str(tmp_path / 'pod.json'))}
        kubectl wait --for=condition=Ready pod/sleeper --timeout=120s
        kubectl get pod sleeper -o jsonpath='ID={{.status.containerStatuses[0].containerID}}{{"\\n"}}'
        kubectl apply -f {shlex.quote(str(tmp_path / 'policy.json'))}
        for _ in $(seq 60); do ipset list -n | grep -q '^KUBE-DST-' && break; sleep 1; done
    """
    pids: list[int] = []
    during = {}
    try:
        up = subprocess.run(["bash", "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                            timeout=600)
        assert up.returncode == 0, f"stdout:\n{up.stdout}\nstderr:\n{up.stderr}"
        out = up.stdout
        assert f"KUBECONFIG={state / 'kubeconfig'}" in out
        bin_dir = json.loads((state / "ready").read_text())["bin_dir"]
        assert f"KUBECTL={bin_dir}/kubectl" in out
        assert f"HELM={bin_dir}/helm" in out
        assert "containerd://" in out and " Ready " in out
        assert "ID=containerd://" in out

        ready = json.loads((state / "ready").read_text())
        pids += list(ready["pids"].values()) + [int((state / "supervisor.pid").read_text())]
        assert all(pid_alive(p) for p in pids)
        during = node.snapshot_host()
        during["all_mounts"] = node.mountpoints()

        status = cli(env, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "API ready" in status.stdout

        again = cli(env, "up", "--no-images")  # idempotent: same cluster, same exports
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stderr
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in again.stdout

        missing = cli(env, "load", "modelplex.local/no-such-image:1")
        assert missing.returncode == 1
        assert "error:" in missing.stderr and "no-such-image" in missing.stderr
    finally:
        down = cli(env, "down", timeout=180)
    assert down.returncode == 0, down.stderr
    assert "cluster stopped" in down.stderr
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30, what=f"cluster processes {pids} to exit")

    # The node did change the host while it ran (so the comparison below means something) ...
    assert during["kube_iptables"] and node.NODE_BRIDGE in during["links"]
    assert any(":KUBE-ROUTER-FORWARD" in line for line in during["kube_iptables"])  # the policy agent's
    assert [s for s in during["ipsets"] if s.startswith("KUBE-DST-")], during["ipsets"]
    ours = [m for m in during["all_mounts"] if m.startswith(str(state))]
    assert any("/netns/" in m for m in ours) and any(m.endswith("/rootfs") for m in ours), ours
    # ... and `down` undid all of it.
    after = node.snapshot_host()
    for key in before:
        assert after[key] == before[key], f"{key} differs after down:\nbefore {before[key]}\nafter  {after[key]}"
    assert not [m for m in node.mountpoints() if m.startswith(str(state))]
    assert containerd_root().is_dir()  # the image store is a cache, kept for the next `up`

    status = cli(env, "status")
    assert status.returncode != 0
    assert "not running" in status.stdout
