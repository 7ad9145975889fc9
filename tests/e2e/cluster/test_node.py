"""The real node: pods in containerd, CNI addresses, Services through kube-proxy, cluster DNS,
``kubectl logs/exec``, the ``kubernetes`` Service, restart policies, and no route off the machine."""

from __future__ import annotations

import ipaddress
import json

import pytest
from kubernetes import client

from modelplex_cluster import node
from modelplex_cluster.controlplane import POLICY_AGENT
from modelplex_cluster.testing import http_get, wait_for

from e2e.busybox import BUSYBOX

pytestmark = pytest.mark.e2e

POD_NET = ipaddress.ip_network(node.POD_CIDR)
SERVICE_NET = ipaddress.ip_network(node.SERVICE_CIDR)
NON_ROOT = {
    "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
LOCKED_DOWN = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def pod(name: str, script: str, *, restart: str = "Never", **spec) -> dict:
    """A busybox pod running ``sh -c script`` as a non-root user on a read-only root."""
    container = {"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                 "securityContext": LOCKED_DOWN, **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": spec.pop("labels", {})},
            "spec": {"restartPolicy": restart, "securityContext": NON_ROOT, "terminationGracePeriodSeconds": 2,
                     "containers": [container], **spec}}


def wait_phase(core, namespace: str, name: str, phases=("Succeeded", "Failed"), timeout: float = 120):
    return wait_for(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase in phases and p,
                    timeout=timeout, what=f"pod {namespace}/{name} in phase {phases}")


def run_to_completion(cp, core, namespace: str, name: str, script: str, **spec) -> tuple[object, str]:
    core.create_namespaced_pod(namespace, pod(name, script, **spec))
    done = wait_phase(core, namespace, name)
    return done, cp.pod_log(namespace, name)


def test_the_node_runs_containerd_and_is_ready(control_plane):
    nodes = json.loads(control_plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    (item,) = nodes
    info = item["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert info["kubeletVersion"] == json.loads(control_plane.kubectl("version", "-o", "json").stdout)[
        "serverVersion"]["gitVersion"]
    addresses = {a["type"]: a["address"] for a in item["status"]["addresses"]}
    assert addresses["InternalIP"] == node.NODE_IP
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"]["conditions"])
    wide = control_plane.kubectl("get", "nodes", "-o", "wide").stdout
    assert "containerd://" in wide


def test_the_node_agents_read_what_they_serve_from_and_change_nothing(control_plane, kube_namespace):
    """kube-router's firewall and CoreDNS act with credentials of their own, not the admin's."""
    def as_agent(stem: str, *args: str):
        return control_plane.kubectl(*args, kubeconfig=control_plane.pki_dir / f"{stem}.kubeconfig", check=False)

    running = {c.name: " ".join(c.argv) for c in control_plane.components if c.running()}
    assert "policy-agent.kubeconfig" in running[POLICY_AGENT]
    assert "coredns.kubeconfig" in (control_plane.state_dir / "Corefile").read_text()
    for stem, reads in (("policy-agent", ["networkpolicies", "pods", "namespaces", "nodes", "endpointslices"]),
                        ("coredns", ["services", "endpointslices", "namespaces"])):
        for resource in reads:
            listed = as_agent(stem, "get", resource, "--all-namespaces", "-o", "name")
            assert listed.returncode == 0, (stem, resource, listed.stderr)
        for denied in (["get", "secrets", "-n", kube_namespace],
                       ["get", "configmaps", "-n", kube_namespace],
                       ["create", "configmap", "agent-wrote-this", "-n", kube_namespace],
                       ["delete", "namespace", kube_namespace, "--wait=false"]):
            answer = as_agent(stem, *denied)
            assert answer.returncode != 0 and "forbidden" in answer.stderr.lower(), (stem, denied, answer.stderr)
    assert control_plane.kubectl("get", "configmap", "agent-wrote-this", "-n", kube_namespace,
                                 check=False).returncode != 0


def test_a_deployment_behind_a_service_with_dns(control_plane, kube_namespace):
    api = control_plane.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = kube_namespace
    labels = {"app": "web"}
    # Each pod serves its own name from an emptyDir: the root filesystem is read-only.
    serve = "mkdir -p /tmp/www && echo $POD_NAME > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
    template = pod("unused", serve, labels=labels, container={
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "50m", "memory": "32Mi"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }, volumes=[{"name": "tmp", "emptyDir": {}}])
    template["spec"]["restartPolicy"] = "Always"
    apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": template["spec"]}},
    })
    core.create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    })
    wait_for(lambda: (apps.read_namespaced_deployment("web", ns).status.ready_replicas or 0) == 2,
             timeout=180, what="2 ready replicas of deployment web")

    pods = core.list_namespaced_pod(ns, label_selector="app=web").items
    names = sorted(p.metadata.name for p in pods)
    for p in pods:
        (status,) = p.status.container_statuses
        assert status.container_id.startswith("containerd://")
        assert p.status.qos_class == "Guaranteed"
        assert ipaddress.ip_address(p.status.pod_ip) in POD_NET
        # the pod's own address answers from the host
        assert http_get(f"http://{p.status.pod_ip}:8080/")[1].decode().strip() == p.metadata.name

    # the ClusterIP answers from the host, through kube-proxy's rules, from both pods
    svc = core.read_namespaced_service("web", ns)
    assert ipaddress.ip_address(svc.spec.cluster_ip) in SERVICE_NET
    seen = set()

    def both_seen():
        seen.add(http_get(f"http://{svc.spec.cluster_ip}/", timeout=3)[1].decode().strip())
        return sorted(seen) == names

    wait_for(both_seen, timeout=60, interval=0.1, what=f"answers from {names} through {svc.spec.cluster_ip}")

    # from a pod: the Service's DNS name (short and full) resolves through CoreDNS to the ClusterIP
    # (Debian's busybox wget crashes on its own -T: `timeout` bounds it instead.)
    script = (f"nslookup web.{ns}.svc.cluster.local && timeout 10 wget -qO- http://web/ "
              f"&& timeout 10 wget -qO- http://web.{ns}.svc.cluster.local/")
    done, log = run_to_completion(control_plane, core, ns, "client", script)
    assert done.status.phase == "Succeeded", log
    assert svc.spec.cluster_ip in log
    assert sum(log.count(name) for name in names) >= 2, log

    apps.delete_namespaced_deployment("web", ns)
    wait_for(lambda: not core.list_namespaced_pod(ns, label_selector="app=web").items, timeout=120,
             what="the deployment's pods to be deleted")
    with pytest.raises(OSError):
        http_get(f"http://{pods[0].status.pod_ip}:8080/", timeout=2)


def test_kubectl_logs_and_exec_reach_the_kubelet(control_plane, kube_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_pod(kube_namespace, pod("sleeper", "echo started as $(id -u); exec sleep 600"))
    wait_phase(core, kube_namespace, "sleeper", phases=("Running",))
    wait_for(lambda: "started as 10001" in control_plane.pod_log(kube_namespace, "sleeper"), timeout=30,
             what="the pod's log through kubectl logs")
    out = control_plane.kubectl("exec", "-n", kube_namespace, "sleeper", "--", "sh", "-c",
                                "id -u; cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; "
                                "touch /readonly 2>&1 || echo refused").stdout
    uid, namespace, *rest = out.split("\n", 2)
    assert uid == "10001"
    assert namespace == kube_namespace
    assert "Read-only file system" in rest[0] and "refused" in rest[0]


def test_pods_reach_the_api_through_the_kubernetes_service(control_plane, kube_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    # The default ServiceAccount may not list pods: a 403 from the real API server, by name and ClusterIP.
    script = (f'timeout 10 wget -S -O- --no-check-certificate --header "Authorization: Bearer $(cat {sa}/token)" '
              f"https://kubernetes.default.svc/api/v1/namespaces/{kube_namespace}/pods 2>&1; "
              f"nslookup kubernetes.default.svc.cluster.local")
    done, log = run_to_completion(control_plane, core, kube_namespace, "api-client", script)
    assert "403 Forbidden" in log, log
    assert f"system:serviceaccount:{kube_namespace}:default" in log or "forbidden" in log.lower(), log
    assert "10.96.0.1" in log, log


def test_env_configmap_volume_and_exit_codes(control_plane, kube_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_config_map(kube_namespace, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "spec"},
        "data": {"spec.yaml": "replicas: 3\n", "level": "debug"},
    })
    script = 'echo "RESULT $POD_NAME $POD_NAMESPACE $MY_IP $LEVEL $GREETING"; cat /etc/modelplex/spec.yaml; exit 3'
    done, log = run_to_completion(control_plane, core, kube_namespace, "envtest", script, container={
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "spec", "key": "level"}}},
            {"name": "GREETING", "value": "hello-$(POD_NAME)"},
        ],
        "volumeMounts": [{"name": "spec", "mountPath": "/etc/modelplex"}],
    }, volumes=[{"name": "spec", "configMap": {"name": "spec"}}])
    assert done.status.phase == "Failed"
    assert done.status.container_statuses[0].state.terminated.exit_code == 3
    assert f"RESULT envtest {kube_namespace} {done.status.pod_ip} debug hello-envtest" in log, log
    assert "replicas: 3" in log


def test_a_crashing_container_is_restarted(control_plane, kube_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_pod(kube_namespace, pod("crashes", "exit 4", restart="Always"))

    def restarted():
        st = (core.read_namespaced_pod("crashes", kube_namespace).status.container_statuses or [None])[0]
        return st is not None and st.restart_count >= 2 and st.last_state.terminated is not None and st

    st = wait_for(restarted, timeout=120, what="pod crashes to be restarted twice")
    assert st.last_state.terminated.exit_code == 4


def test_pods_have_no_route_off_the_machine(control_plane, kube_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    done, log = run_to_completion(control_plane, core, kube_namespace, "routes", "cat /proc/net/route")
    assert done.status.phase == "Succeeded", log
    routes = [line.split() for line in log.splitlines()[1:] if line.strip()]
    destinations = {ipaddress.ip_network((_ip(r[1]), _ip(r[7]))) for r in routes}
    assert destinations == {POD_NET, SERVICE_NET}, log  # no 0.0.0.0/0


def _ip(little_endian_hex: str) -> str:
    return str(ipaddress.ip_address(bytes.fromhex(little_endian_hex)[::-1]))
