"""The local control plane itself: API, controllers, RBAC, the test kubelet, the CLI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from modelplex_cluster.testing import http_get, pid_alive, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "hack" / "control-plane" / "versions.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def pod_pids(pod) -> list[int]:
    pids = []
    for st in pod.status.container_statuses or []:
        if st.container_id and st.container_id.startswith("modelplex://"):
            pids.append(int(st.container_id.split("://", 1)[1]))
    return pids


def is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def run_pod(core, namespace: str, name: str, script: str, **spec) -> dict:
    """Create a restartPolicy=Never pod running `python -c script`."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python:3.11",
                            "command": ["python", "-c", textwrap.dedent(script)], **spec.pop("container", {})}],
            **spec,
        },
    }
    core.create_namespaced_pod(namespace, body)
    return body


def wait_phase(core, namespace: str, name: str, phases=("Succeeded", "Failed"), timeout: float = 90):
    return wait_for(
        lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase in phases and p,
        timeout=timeout, what=f"pod {namespace}/{name} in phase {phases}",
    )


# --------------------------------------------------------------------------- API and kubectl


def test_kubectl_talks_to_the_cluster(control_plane):
    out = control_plane.kubectl("get", "ns").stdout
    assert "default" in out.split()
    assert "kube-system" in out

    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    expected = "v" + versions()["KUBERNETES_VERSION"]
    assert version["serverVersion"]["gitVersion"] == expected
    assert version["clientVersion"]["gitVersion"] == expected
    # the kubectl used is the one we built, not whatever is on the machine
    assert Path(control_plane.bin_dir, "kubectl").is_file()
    assert control_plane.env()["PATH"].split(os.pathsep)[0] == str(control_plane.bin_dir)


def test_rbac_is_enforced_for_unprivileged_users(control_plane, kube_namespace):
    # impersonating a user with no bindings: forbidden (RBAC is real, not AlwaysAllow)
    proc = control_plane.kubectl("get", "pods", "-n", kube_namespace, "--as=nobody", check=False)
    assert proc.returncode != 0
    assert "forbidden" in proc.stderr.lower()
    assert control_plane.kubectl("auth", "can-i", "create", "pods", "--as=nobody",
                                 check=False).stdout.strip() == "no"
    assert control_plane.kubectl("auth", "can-i", "create", "pods").stdout.strip() == "yes"


def test_crd_and_custom_objects(control_plane, kube_namespace):
    group = f"e2e{uuid.uuid4().hex[:6]}.modelplex.io"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object", "required": ["size"],
                        "properties": {"size": {"type": "integer", "minimum": 1}, "color": {"type": "string"}},
                    }, "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }},
            }],
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd))
    try:
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s")
        api = client.CustomObjectsApi(control_plane.api_client())
        wait_for(lambda: api.list_namespaced_custom_object(group, "v1", kube_namespace, "widgets") is not None,
                 what="the widgets endpoint")
        body = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w1"},
                "spec": {"size": 3, "color": "blue"}}
        api.create_namespaced_custom_object(group, "v1", kube_namespace, "widgets", body)
        got = api.get_namespaced_custom_object(group, "v1", kube_namespace, "widgets", "w1")
        assert got["spec"] == {"size": 3, "color": "blue"}
        assert got["metadata"]["uid"]

        api.patch_namespaced_custom_object_status(group, "v1", kube_namespace, "widgets", "w1",
                                                  {"status": {"seen": True}})
        assert api.get_namespaced_custom_object(group, "v1", kube_namespace, "widgets", "w1")["status"] == {
            "seen": True}

        # the OpenAPI schema is enforced by the real apiserver
        bad = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"size": 0}}
        with pytest.raises(client.ApiException) as err:
            api.create_namespaced_custom_object(group, "v1", kube_namespace, "widgets", bad)
        assert err.value.status == 422

        listed = control_plane.kubectl("get", "wdg", "-n", kube_namespace, "-o", "name").stdout
        assert f"widget.{group}/w1" in listed
    finally:
        control_plane.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


# --------------------------------------------------------------------------- the test kubelet


def test_deployment_pods_run_as_processes_and_stop_on_delete(control_plane, kube_namespace):
    api = control_plane.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    labels = {"app": "web"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "http",
                        "image": "python:3.11",
                        "command": ["python", "-m", "http.server", "--bind", "$(POD_IP)", "8080"],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                    }],
                },
            },
        },
    }
    apps.create_namespaced_deployment(kube_namespace, deployment)

    def ready_replicas():
        d = apps.read_namespaced_deployment("web", kube_namespace)
        return (d.status.ready_replicas or 0) == 2

    wait_for(ready_replicas, timeout=90, what="2 ready replicas of deployment web")

    pods = core.list_namespaced_pod(kube_namespace, label_selector="app=web").items
    assert len(pods) == 2
    ips = [p.status.pod_ip for p in pods]
    assert len(set(ips)) == 2, ips
    pids = []
    for pod in pods:
        assert pod.spec.node_name == control_plane.node_name
        assert pod.status.phase == "Running"
        assert is_ready(pod)
        ip = pod.status.pod_ip
        assert ip.startswith("127.") and ip != "127.0.0.1"
        # both pods serve port 8080, each on its own loopback address
        status, body = http_get(f"http://{ip}:8080/")
        assert status == 200 and b"Directory listing" in body
        (pid,) = pod_pids(pod)
        assert pid_alive(pid)
        pids.append(pid)
        assert pod.metadata.owner_references[0].kind == "ReplicaSet"

    # no kube-proxy: the helper resolves a Service to its ready pods' addresses
    core.create_namespaced_service(kube_namespace, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    })
    expected = sorted(f"{ip}:8080" for ip in ips)
    wait_for(lambda: control_plane.service_endpoints(kube_namespace, "web") == expected, timeout=60,
             what=f"service web endpoints {expected}")

    apps.delete_namespaced_deployment("web", kube_namespace)
    wait_for(lambda: not core.list_namespaced_pod(kube_namespace, label_selector="app=web").items,
             timeout=90, what="the deployment's pods to be deleted")
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), timeout=30, what=f"processes {pids} to exit")
    for ip in ips:
        with pytest.raises(OSError):
            http_get(f"http://{ip}:8080/", timeout=2)


def test_env_configmap_volume_and_kubectl_logs(control_plane, kube_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_config_map(kube_namespace, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "spec"},
        "data": {"spec.yaml": "replicas: 3\n", "level": "debug"},
    })
    script = """
        import json, os, pathlib
        spec = pathlib.Path(os.environ["MODELPLEX_SPEC"]).read_text()
        print("RESULT " + json.dumps({
            "env": {k: os.environ.get(k) for k in
                    ["MODELPLEX_SPEC", "POD_NAME", "POD_NAMESPACE", "POD_IP", "MY_IP", "SA", "LEVEL", "GREETING"]},
            "spec": spec, "cwd": os.getcwd(), "argv_file": pathlib.Path("/etc/modelplex/spec.yaml").exists(),
        }))
    """
    run_pod(core, kube_namespace, "envtest", script, container={
        "env": [
            {"name": "MODELPLEX_SPEC", "value": "/etc/modelplex/spec.yaml"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "spec", "key": "level"}}},
            {"name": "GREETING", "value": "hello $(POD_NAME)"},
        ],
        "volumeMounts": [{"name": "spec", "mountPath": "/etc/modelplex"}],
    }, volumes=[{"name": "spec", "configMap": {"name": "spec"}}])
    pod = wait_phase(core, kube_namespace, "envtest")
    log_text = control_plane.pod_log(kube_namespace, "envtest")
    assert pod.status.phase == "Succeeded", log_text
    line = next(line for line in log_text.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    env = result["env"]
    assert result["spec"] == "replicas: 3\n"
    assert env["MODELPLEX_SPEC"] != "/etc/modelplex/spec.yaml"
    assert env["MODELPLEX_SPEC"].startswith(str(control_plane.state_dir))
    assert env["POD_NAME"] == "envtest"
    assert env["POD_NAMESPACE"] == kube_namespace
    assert env["POD_IP"] == env["MY_IP"] == pod.status.pod_ip
    assert env["SA"] == "default"
    assert env["LEVEL"] == "debug"
    assert env["GREETING"] == "hello envtest"
    assert result["cwd"] == str(REPO)
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0

    # `kubectl logs` goes through the apiserver to the kubelet's log server
    logs = control_plane.kubectl("logs", "-n", kube_namespace, "envtest").stdout
    assert "RESULT " in logs


def test_restart_policies(control_plane, kube_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    run_pod(core, kube_namespace, "fails", "import sys; print('bye'); sys.exit(3)")
    pod = wait_phase(core, kube_namespace, "fails")
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3

    run_pod(core, kube_namespace, "crashes", "import sys; sys.exit(4)", restartPolicy="Always")

    def restarted():
        p = core.read_namespaced_pod("crashes", kube_namespace)
        st = (p.status.container_statuses or [None])[0]
        return st is not None and st.restart_count >= 2 and st.last_state.terminated is not None and st

    st = wait_for(restarted, timeout=90, what="pod crashes to be restarted twice")
    assert st.last_state.terminated.exit_code == 4
    assert core.read_namespaced_pod("crashes", kube_namespace).status.phase == "Running"


def test_pod_service_account_gets_exactly_its_rbac(control_plane, kube_namespace):
    api = control_plane.api_client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    ns = kube_namespace
    core.create_namespaced_service_account(ns, {"apiVersion": "v1", "kind": "ServiceAccount",
                                                "metadata": {"name": "reader"}})
    rbac.create_namespaced_role(ns, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
    })
    rbac.create_namespaced_role_binding(ns, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
    })
    kubectl = str(Path(control_plane.bin_dir) / "kubectl")
    script = f"""
        import json, os, subprocess
        from kubernetes import client, config
        config.load_kube_config()
        core = client.CoreV1Api()
        out = {{"kubeconfig": os.environ["KUBECONFIG"]}}
        out["pods"] = [p.metadata.name for p in core.list_namespaced_pod({ns!r}).items]
        try:
            core.list_namespaced_secret({ns!r})
            out["secrets"] = "allowed"
        except client.ApiException as exc:
            out["secrets"] = exc.status
        def can_i(*args):
            return subprocess.run([{kubectl!r}, "auth", "can-i", *args], capture_output=True, text=True).stdout.strip()
        out["can_get_pods"] = can_i("get", "pods")
        out["can_delete_pods"] = can_i("delete", "pods")
        out["whoami"] = subprocess.run([{kubectl!r}, "auth", "whoami", "-o", "jsonpath={{.status.userInfo.username}}"],
                                       capture_output=True, text=True).stdout.strip()
        print("RESULT " + json.dumps(out))
    """
    run_pod(core, ns, "rbac", script, serviceAccountName="reader")
    pod = wait_phase(core, ns, "rbac")
    log_text = control_plane.pod_log(ns, "rbac")
    assert pod.status.phase == "Succeeded", log_text
    result = json.loads(next(line for line in log_text.splitlines() if line.startswith("RESULT "))[7:])
    assert result["kubeconfig"].startswith(str(control_plane.state_dir))
    assert result["kubeconfig"] != str(control_plane.kubeconfig)
    assert "rbac" in result["pods"]
    assert result["secrets"] == 403
    assert result["can_get_pods"] == "yes"
    assert result["can_delete_pods"] == "no"
    assert result["whoami"] == f"system:serviceaccount:{ns}:reader"


# --------------------------------------------------------------------------- the CLI


def test_cluster_up_and_down_cli(control_plane, tmp_path):
    state = tmp_path / "cluster"
    env = dict(os.environ)
    env["MODELPLEX_CLUSTER_DIR"] = str(state)
    env.pop("KUBECONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    py = shlex.quote(sys.executable)
    prefix = f"127.{(int(control_plane.pod_ip_prefix.split('.')[1]) + 1) % 256}"
    pod_yaml = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
        "spec": {"containers": [{"name": "main", "image": "x", "command": ["python", "-c",
                                                                           "import time; time.sleep(600)"]}]},
    })
    (tmp_path / "pod.yaml").write_text(pod_yaml)
    script = f"""
        set -euo pipefail
        eval "$({py} -m modelplex_cluster up --pod-ip-prefix {prefix})"
        echo "KUBECONFIG=$KUBECONFIG"
        echo "KUBECTL=$(command -v kubectl)"
        echo "HELM=$(command -v helm)"
        kubectl get ns
        kubectl apply -f {shlex.quote(str(tmp_path / 'pod.yaml'))}
        kubectl wait --for=condition=Ready pod/sleeper --timeout=90s
        kubectl get pod sleeper -o jsonpath='PID={{.status.containerStatuses[0].containerID}}{{"\\n"}}'
    """
    pids: list[int] = []
    pod_pid = 0
    try:
        up = subprocess.run(["bash", "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                            timeout=400)
        assert up.returncode == 0, f"stdout:\n{up.stdout}\nstderr:\n{up.stderr}"
        out = up.stdout
        assert f"KUBECONFIG={state / 'kubeconfig'}" in out
        assert "KUBECTL=" + str(Path(control_plane.bin_dir) / "kubectl") in out
        assert "HELM=" + str(Path(control_plane.bin_dir) / "helm") in out
        assert "default" in out
        pod_pid = int(out.split("PID=modelplex://", 1)[1].split()[0])
        assert pid_alive(pod_pid)

        ready = json.loads((state / "ready").read_text())
        pids += list(ready["pids"].values()) + [int((state / "supervisor.pid").read_text())]
        assert all(pid_alive(p) for p in pids)

        status = subprocess.run([sys.executable, "-m", "modelplex_cluster", "status"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "API ready" in status.stdout

        # `up` again is idempotent: same cluster, same exports
        again = subprocess.run([sys.executable, "-m", "modelplex_cluster", "up"], env=env,
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stderr
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in again.stdout
    finally:
        down = subprocess.run([sys.executable, "-m", "modelplex_cluster", "down"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "cluster stopped" in down.stderr
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30, what=f"cluster processes {pids} to exit")
    wait_for(lambda: not (pod_pid and pid_alive(pod_pid)), timeout=30, what="the pod process to exit")
    status = subprocess.run([sys.executable, "-m", "modelplex_cluster", "status"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode != 0
    assert "not running" in status.stdout
