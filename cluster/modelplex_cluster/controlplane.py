"""A real one-node Kubernetes cluster on this machine: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, and a node of containerd + runc, a CNI
bridge, the kubelet, kube-proxy (iptables), CoreDNS and a NetworkPolicy agent
(kube-router's firewall only: iptables + ipset).

The binaries come from ``hack/control-plane/build.sh`` (built from their Go
modules and cached), the policy agent from ``hack/control-plane/build-policy-agent.sh``
(cached apart); containerd, runc, ipset and the CNI plugins are Debian's. The API
server listens on the node's bridge address, etcd and the controllers on
127.0.0.1, with certificates made here; RBAC is on and real.

    cp = ControlPlane(build_binaries())
    cp.start()          # returns once the API answers and the node is Ready
    ... cp.kubeconfig, cp.env(), cp.api_client(), cp.kubectl("get", "ns") ...
    cp.stop()
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

import yaml

from modelplex.processes import ProcessExited, free_port, log_tail, running, spawn, stop, wait_for
from modelplex_cluster import certs, node

NODE_NAME = "modelplex-node"
KUBELET_PORT = 10250
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl", "helm",
         "coredns")
POLICY_AGENT = "kube-router"
#: The users the node's agents act as: each reads what it serves from and may change nothing
#: (``AGENT_ROLES``), where the admin credential would let a compromised agent do anything.
POLICY_AGENT_USER = "modelplex:policy-agent"
DNS_USER = "modelplex:coredns"
_READ = ["get", "list", "watch"]
#: What each agent reads: kube-router's firewall (its informers: pods, namespaces, nodes,
#: services, endpoints, endpoint slices, NetworkPolicies) and CoreDNS's kubernetes plugin
#: (services, endpoint slices, namespaces; "pods insecure" never lists pods).
AGENT_ROLES = {
    POLICY_AGENT_USER: [
        {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"], "verbs": _READ},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _READ},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _READ},
    ],
    DNS_USER: [
        {"apiGroups": [""], "resources": ["services", "endpoints", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ],
}
#: The chain the policy agent adds once it has synced its rules (the jump from FORWARD to it).
POLICY_AGENT_CHAIN = "KUBE-ROUTER-FORWARD"


class ControlPlaneError(RuntimeError):
    """Starting or talking to the control plane failed; the message names the logs."""


# --------------------------------------------------------------------------- paths


def repo_root() -> Path | None:
    """The repository this package was loaded from, if it was loaded from one."""
    here = Path(__file__).resolve().parent
    for parent in (here, *here.parents):
        if (parent / "hack" / "control-plane" / "build.sh").is_file():
            return parent
    return None


def build_script(name: str = "build.sh") -> Path:
    """``hack/control-plane/<name>`` (``MODELPLEX_CONTROL_PLANE_BUILD`` names build.sh elsewhere;
    the other scripts are looked for beside it)."""
    env = os.environ.get("MODELPLEX_CONTROL_PLANE_BUILD")
    if env:
        return Path(env) if name == "build.sh" else Path(env).with_name(name)
    root = repo_root()
    if root is None:
        raise ControlPlaneError(
            "cannot find hack/control-plane/build.sh (modelplex is not running from its repository); "
            "set MODELPLEX_CONTROL_PLANE_BUILD to the script or MODELPLEX_CONTROL_PLANE_BIN to a folder "
            "holding the binaries"
        )
    return root / "hack" / "control-plane" / name


def build_binaries(force: bool = False, *, quiet: bool = False) -> Path:
    """Build the control-plane binaries, or reuse the cached ones; returns the bin folder.

    ``MODELPLEX_CONTROL_PLANE_BIN`` names a ready folder and skips the build.
    Progress of the build script goes to this process's stderr.
    """
    env_bin = os.environ.get("MODELPLEX_CONTROL_PLANE_BIN")
    if env_bin:
        bin_dir = Path(env_bin)
        missing = [t for t in TOOLS if not (bin_dir / t).is_file()]
        if missing:
            raise ControlPlaneError(f"MODELPLEX_CONTROL_PLANE_BIN={bin_dir} lacks {', '.join(missing)}")
        return bin_dir
    return _run_build(build_script(), force, quiet)


def build_policy_agent(force: bool = False, *, quiet: bool = False) -> Path:
    """Build the node's NetworkPolicy agent (kube-router), or reuse the cached one; returns the
    binary. A ``kube-router`` in ``MODELPLEX_CONTROL_PLANE_BIN`` is used as it is."""
    env_bin = os.environ.get("MODELPLEX_CONTROL_PLANE_BIN")
    if env_bin and (Path(env_bin) / POLICY_AGENT).is_file():
        return Path(env_bin) / POLICY_AGENT
    return _run_build(build_script("build-policy-agent.sh"), force, quiet) / POLICY_AGENT


def _run_build(script: Path, force: bool, quiet: bool) -> Path:
    """Run a build script (progress to this process's stderr); returns the bin folder it prints."""
    cmd = ["bash", str(script)] + (["--force"] if force else [])
    proc = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        text=True,
    )
    if proc.returncode != 0:
        raise ControlPlaneError(f"{script} failed with exit code {proc.returncode} (its output is above)")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise ControlPlaneError(f"{script} printed no bin folder")
    return Path(lines[-1].strip())


# --------------------------------------------------------------------------- helpers


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, *, user: str, client_cert: Path | None = None,
                     client_key: Path | None = None, token: str | None = None, namespace: str | None = None,
                     cluster: str = "modelplex") -> Path:
    """Write a self-contained kubeconfig (certificates embedded)."""
    creds: dict = {}
    if client_cert and client_key:
        creds["client-certificate-data"] = _b64(Path(client_cert).read_bytes())
        creds["client-key-data"] = _b64(Path(client_key).read_bytes())
    if token:
        creds["token"] = token
    context: dict = {"cluster": cluster, "user": user}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": cluster, "context": context}],
        "current-context": cluster,
    }
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def containerd_root() -> Path:
    """containerd's content store and image snapshots: kept between clusters, like the binaries."""
    return Path(os.environ.get("MODELPLEX_CACHE") or Path.home() / ".cache" / "modelplex") / "node" / "containerd"


# --------------------------------------------------------------------------- the cluster


@dataclass
class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and (``node=True``) one real
    node: containerd + runc, a CNI bridge, the kubelet, kube-proxy and CoreDNS.

    ``state_dir`` holds certificates, etcd data, kubeconfigs, configs and logs (a fresh
    temporary folder when not given; removed by :meth:`stop` unless ``keep_state``). The node
    needs root; :meth:`stop` undoes every change it made to the host (see ``node.py``).
    Without the node, everything listens on 127.0.0.1.
    """

    bin_dir: Path
    state_dir: Path | None = None
    node: bool = True
    node_name: str = NODE_NAME
    log_stream: IO[str] | None = None
    keep_state: bool = False  # keep a temporary state dir (made when none was given) after stop()
    policy_agent: Path | None = None  # kube-router's binary; built (cached) by start() when not given
    components: list[Component] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bin_dir = Path(self.bin_dir)
        self._own_state = self.state_dir is None
        self.state_dir = Path(self.state_dir or tempfile.mkdtemp(prefix="modelplex-cluster-"))
        self.pki_dir = self.state_dir / "pki"
        self.logs_dir = self.state_dir / "logs"
        self.kubelet_dir = self.state_dir / "kubelet"
        self.containerd_dir = self.state_dir / "containerd"
        self.containerd_socket = self.containerd_dir / "containerd.sock"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.host_snapshot_file = self.state_dir / "host-before.json"
        self.address = node.NODE_IP if self.node else "127.0.0.1"
        self.api_port: int | None = None
        self.etcd_port: int | None = None
        self.server: str | None = None
        self.ca_file = self.pki_dir / "ca.crt"
        self._started = False

    # ------------------------------------------------------------------ public helpers

    def env(self, base: dict | None = None) -> dict:
        """Environment for tools talking to this cluster: KUBECONFIG set, binaries first on PATH."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def api_client(self):
        """A new ``kubernetes.client.ApiClient`` with admin rights (system:masters)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120, kubeconfig: Path | str | None = None) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster; returns the CompletedProcess (text)."""
        env = self.env()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            input=input, capture_output=True, text=True, env=env, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """What a pod's container printed (``kubectl logs``, through the kubelet)."""
        args = ["logs", "-n", namespace, name] + (["-c", container] if container else [])
        return self.kubectl(*args, check=False).stdout

    def load_images(self, tags: list[str]) -> None:
        """Put local docker images on the node (``docker save | ctr images import``)."""
        node.load_docker_images(self.containerd_socket, tags)

    def import_image(self, archive: bytes) -> None:
        """Put an OCI image archive (see ``node.oci_archive``) on the node."""
        node.import_image(self.containerd_socket, archive)

    def container_pid(self, container_id: str) -> int:
        """The host pid of a container's main process (``containerd://ID`` from a pod's status)."""
        wanted = container_id.split("://", 1)[-1]
        for line in node.ctr(self.containerd_socket, "tasks", "list").splitlines()[1:]:
            task, pid, *_ = line.split()
            if task == wanted:
                return int(pid)
        raise ControlPlaneError(f"no running task for container {container_id}")

    def log_paths(self) -> dict[str, Path]:
        """Component name -> log file."""
        return {c.name: c.log for c in self.components}

    def describe_logs(self, lines: int = 20) -> str:
        """The tail of every component log and the pods' state, for failure messages."""
        parts = [f"--- {c.name}: {c.log}\n{log_tail(c.log, lines)}" for c in self.components]
        if self.running():
            pods = self.kubectl("get", "pods", "-A", "-o", "wide", check=False, timeout=20)
            events = self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False, timeout=20)
            parts.append(f"--- pods\n{pods.stdout}{pods.stderr}")
            parts.append("--- events (last)\n" + "\n".join(events.stdout.splitlines()[-lines:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "ControlPlane":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _say(self, msg: str) -> None:
        stream = self.log_stream if self.log_stream is not None else sys.stderr
        print(msg, file=stream, flush=True)

    def start(self, timeout: float = 240.0) -> "ControlPlane":
        """Start everything; returns once the API is ready, the ``default`` ServiceAccount
        exists and (with the node) the node is Ready and cluster DNS answers."""
        if self._started:
            return self
        needed = TOOLS if self.node else TOOLS[:4]
        missing = [t for t in needed if not (self.bin_dir / t).is_file()]
        if missing:
            raise ControlPlaneError(f"{self.bin_dir} lacks {', '.join(missing)}; run hack/control-plane/build.sh")
        if self.node:
            undone = clear_abandoned_node()
            if undone:
                self._say(f"undid what an abandoned node left on the host: {', '.join(undone)}")
            try:
                node.check_requirements()
            except node.NodeError as exc:
                raise ControlPlaneError(str(exc)) from None
            if self.policy_agent is None:
                self.policy_agent = build_policy_agent()
        self._started = True
        self.components = []
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            self._prepare()
            if self.node:
                self.host_snapshot_file.write_text(json.dumps(node.snapshot_host(), indent=1))
                node.setup_network(self.state_dir)
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self._start_controller_manager()
            self._start_scheduler()
            if self.node:
                self._grant_node_agents()
                self._start_containerd(deadline)
                self._start_kubelet()
                self._start_kube_proxy()
                self._start_coredns()
            self._wait_settled(deadline)
            if self.node:
                self._start_policy_agent(deadline)
        except BaseException as exc:
            details = self.describe_logs()
            self.keep_state = True  # keep the logs named in the error
            self.stop()
            if isinstance(exc, (ControlPlaneError, node.NodeError)):
                raise ControlPlaneError(f"{exc}\nstate dir: {self.state_dir}\n{details}") from None
            raise
        self._say(f"cluster ready in {time.monotonic() - t0:.1f}s: {self.server} (state in {self.state_dir})")
        return self

    def stop(self) -> list[str]:
        """Stop the node (its containers included) and the control plane, and undo the node's host
        changes; returns what was undone on the host."""
        for name in (POLICY_AGENT, "coredns", "kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager"):
            comp = self._component(name)
            if comp is not None and comp.proc is not None:
                stop(comp.proc, grace=20 if name == "kubelet" else 10)
        undone = []
        containerd = self._component("containerd")
        if containerd is not None and containerd.running():
            removed = node.remove_all_containers(self.containerd_socket)
            if removed:
                undone.append(f"{removed} containers")
        for comp in reversed(self.components):
            if comp.proc is not None:
                stop(comp.proc)
        if self.node and self.host_snapshot_file.exists():
            undone += restore_node_host(self.state_dir)
        self._started = False
        if self._own_state and not self.keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return undone

    def running(self) -> bool:
        return bool(self.components) and all(c.running() for c in self.components)

    def check_alive(self) -> None:
        try:
            for c in self.components:
                if c.proc is not None:
                    running(c.proc, c.name, c.log)
        except ProcessExited as error:
            raise ControlPlaneError(str(error)) from None

    # ------------------------------------------------------------------ steps

    def _client_kubeconfig(self, stem: str, user: str, organization: str | None = None) -> Path:
        pair = self._ca.issue(stem, user, organization=organization, client=True)
        return write_kubeconfig(self.pki_dir / f"{stem}.kubeconfig", self.server, self._ca.pem,
                                user=user, client_cert=pair.cert, client_key=pair.key)

    def _prepare(self) -> None:
        for d in (self.pki_dir, self.logs_dir, self.state_dir / "etcd"):
            d.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "etcd").chmod(0o700)
        ca = certs.CertificateAuthority(self.pki_dir)
        self._ca = ca
        self._serving = ca.issue(
            "apiserver", "kube-apiserver", server=True,
            server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                          "kubernetes.default.svc.cluster.local"),
            server_ips=tuple(dict.fromkeys(("127.0.0.1", self.address, "10.96.0.1"))),
        )
        self._admin = ca.issue("admin", "modelplex-admin", organization="system:masters", client=True)
        self._kubelet_client = ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organization="system:masters", client=True
        )
        # for the aggregation layer (and so that components find a requestheader CA)
        self._front_proxy = ca.issue("front-proxy-client", "front-proxy-client", client=True)
        self._sa_key, self._sa_pub = certs.service_account_keys(self.pki_dir)
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.api_port = free_port()
        self.server = f"https://{self.address}:{self.api_port}"
        write_kubeconfig(self.kubeconfig, self.server, ca.pem, user="modelplex-admin",
                         client_cert=self._admin.cert, client_key=self._admin.key)
        self._kcm_kubeconfig = self._client_kubeconfig("controller-manager", "system:kube-controller-manager")
        self._scheduler_kubeconfig = self._client_kubeconfig("scheduler", "system:kube-scheduler")
        (self.state_dir / "endpoints.json").write_text(json.dumps({
            "server": self.server, "etcd": f"http://127.0.0.1:{self.etcd_port}",
            "kubeconfig": str(self.kubeconfig), "bin_dir": str(self.bin_dir),
        }, indent=2))

    def _launch(self, name: str, argv: list[str], env: dict | None = None) -> Component:
        comp = Component(name, argv, self.logs_dir / f"{name}.log")
        with open(comp.log, "ab") as f:
            f.write(f"==> {' '.join(argv)}\n".encode())
        # An orphaned component is killed outright (the supervisor's stop() undoes the rest).
        comp.proc = spawn(argv, log=comp.log, env=env, cwd=self.state_dir, death_signal=signal.SIGKILL)
        self.components.append(comp)
        pid_dir = self.state_dir / "pids"
        pid_dir.mkdir(exist_ok=True)
        (pid_dir / f"{name}.pid").write_text(f"{comp.proc.pid}\n")
        return comp

    def _component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def _wait(self, what: str, check, deadline: float, comp: Component | None = None, interval: float = 0.25):
        try:
            return wait_for(check, max(0.0, deadline - time.monotonic()), interval, what, guard=self.check_alive)
        except TimeoutError as error:
            where = f"; log: {comp.log}" if comp else ""
            raise ControlPlaneError(f"{error}{where}") from None

    def _start_etcd(self, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        comp = self._launch("etcd", [
            str(self.bin_dir / "etcd"),
            "--name=modelplex",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=modelplex={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # throwaway data: skip fsync, which is slow on small disks
            "--log-level=warn",
        ])

        def healthy():
            conn = http.client.HTTPConnection("127.0.0.1", self.etcd_port, timeout=2)
            try:
                conn.request("GET", "/health")
                resp = conn.getresponse()
                return resp.status == 200 and json.loads(resp.read()).get("health") == "true"
            finally:
                conn.close()

        self._wait("etcd /health", healthy, deadline, comp)

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self._admin.cert), str(self._admin.key))
        return ctx

    def _api_get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection(self.address, self.api_port, timeout=timeout, context=self._admin_ssl())
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _start_apiserver(self, deadline: float) -> None:
        p = self.pki_dir
        comp = self._launch("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            # On the node's bridge: pods reach it through the `kubernetes` Service, whose
            # endpoint the apiserver keeps at its advertise address.
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={self.api_port}",
            f"--cert-dir={p}",
            f"--tls-cert-file={self._serving.cert}",
            f"--tls-private-key-file={self._serving.key}",
            f"--client-ca-file={self.ca_file}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self._sa_pub}",
            f"--service-account-signing-key-file={self._sa_key}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={node.SERVICE_CIDR}",
            "--allow-privileged=true",
            # `kubectl logs/exec` reach the kubelet with this client certificate, and check its serving one.
            f"--kubelet-client-certificate={self._kubelet_client.cert}",
            f"--kubelet-client-key={self._kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca_file}",
            "--kubelet-preferred-address-types=InternalIP",
            *([] if self.node else ["--endpoint-reconciler-type=none"]),  # no loopback endpoints
            f"--requestheader-client-ca-file={self.ca_file}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self._front_proxy.cert}",
            f"--proxy-client-key-file={self._front_proxy.key}",
            "--profiling=false",
            "--v=1",
        ])

        def ready():
            status, body = self._api_get("/readyz")
            if status != 200:
                raise ControlPlaneError(f"/readyz answered {status}: {body[:300]!r}")
            return True

        self._wait("kube-apiserver /readyz", ready, deadline, comp, interval=0.5)

    def _controller_argv(self, binary: str, kubeconfig: Path, cert_dir: str) -> list[str]:
        """The start of a controller's command line (controller-manager, scheduler): one
        kubeconfig for its API calls and its delegated authn/authz, its secure port on loopback."""
        return [
            str(self.bin_dir / binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.pki_dir / cert_dir}",
        ]

    def _start_controller_manager(self) -> None:
        self._launch("kube-controller-manager", [
            *self._controller_argv("kube-controller-manager", self._kcm_kubeconfig, "controller-manager-serving"),
            f"--service-account-private-key-file={self._sa_key}",
            f"--root-ca-file={self.ca_file}",
            f"--cluster-signing-cert-file={self.ca_file}",
            f"--cluster-signing-key-file={self._ca.key_path}",
            "--use-service-account-credentials=true",
            # No node IPAM (CNI's host-local hands out pod addresses) and no node lifecycle
            # (the one node never goes away; a busy laptop must not evict its pods).
            "--controllers=*,-node-ipam-controller,-node-lifecycle-controller",
            f"--service-cluster-ip-range={node.SERVICE_CIDR}",
            "--leader-elect=false",
            "--cluster-name=modelplex",
            "--v=1",
        ])

    def _start_scheduler(self) -> None:
        self._launch("kube-scheduler", [
            *self._controller_argv("kube-scheduler", self._scheduler_kubeconfig, "scheduler-serving"),
            "--leader-elect=false",
            "--v=1",
        ])

    def _start_containerd(self, deadline: float) -> None:
        d = self.containerd_dir
        cni_conf_dir = d / "cni"
        for path in (d, cni_conf_dir):
            path.mkdir(parents=True, exist_ok=True)
        (cni_conf_dir / "10-modelplex.conflist").write_text(json.dumps(node.cni_config(d / "ipam"), indent=2))
        root = containerd_root()
        root.mkdir(parents=True, exist_ok=True)
        config = d / "config.toml"
        config.write_text(node.containerd_config(root, d / "state", self.containerd_socket, cni_conf_dir))
        comp = self._launch("containerd", ["containerd", "--config", str(config)])
        self._wait("containerd's socket", lambda: node.ctr(self.containerd_socket, "version", timeout=10),
                   deadline, comp)
        self._wait("containerd's CRI", lambda: node.cri_version(self.containerd_socket), deadline, comp)
        if node.PAUSE_IMAGE not in node.image_names(self.containerd_socket):
            node.import_image(self.containerd_socket, node.pause_image())

    def _start_kubelet(self) -> None:
        d = self.kubelet_dir
        d.mkdir(parents=True, exist_ok=True)
        serving = self._ca.issue(
            "kubelet", f"system:node:{self.node_name}", organization="system:nodes", server=True, client=True,
            server_names=("localhost", self.node_name), server_ips=(node.NODE_IP, "127.0.0.1"),
        )
        kubeconfig = write_kubeconfig(self.pki_dir / "kubelet.kubeconfig", self.server, self._ca.pem,
                                      user=f"system:node:{self.node_name}", client_cert=serving.cert,
                                      client_key=serving.key)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": node.NODE_IP,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {"x509": {"clientCAFile": str(self.ca_file)}, "webhook": {"enabled": True},
                               "anonymous": {"enabled": False}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "clusterDNS": [node.NODE_IP],
            "clusterDomain": node.CLUSTER_DOMAIN,
            "resolvConf": "",  # pods get cluster DNS only: no name server of the host
            "podLogsDir": str(d / "pod-logs"),
            # A small test node must not evict or garbage-collect images it cannot pull again.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%", "imagefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "maxPods": 110,
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
        }
        config_path = d / "config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self._launch("kubelet", [
            str(self.bin_dir / "kubelet"),
            f"--config={config_path}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={d / 'root'}",
            f"--cert-dir={d / 'pki'}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={node.NODE_IP}",
            "--v=1",
        ])

    def _start_kube_proxy(self) -> None:
        kubeconfig = self._client_kubeconfig("kube-proxy", "system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "hostnameOverride": self.node_name,
            "clusterCIDR": node.POD_CIDR,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # NodePorts on the node's bridge address only, never on the machine's own interfaces.
            "nodePortAddresses": [f"{node.NODE_IP}/32"],
            # masqueradeAll: a pod reaching itself or a neighbour through a ClusterIP gets the
            # answer back through the node. localhostNodePorts off: route_localnet stays 0.
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "syncPeriod": "30s",
                         "minSyncPeriod": "0s"},
            # Leave the machine's conntrack settings alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        path = self.state_dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self._launch("kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={path}", "--v=1"])

    def _grant_node_agents(self) -> None:
        """Each node agent's ClusterRole and binding (``AGENT_ROLES``), before the agent starts."""
        documents = []
        for user, rules in AGENT_ROLES.items():
            name = user.replace(":", "-")
            documents.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                              "metadata": {"name": name}, "rules": rules})
            documents.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                              "metadata": {"name": name},
                              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                              "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))

    def _start_coredns(self) -> None:
        self._dns_ready_port = free_port()
        corefile = self.state_dir / "Corefile"
        # The node's name server (the kubelet's clusterDNS): cluster names only; nothing is
        # forwarded, since nothing beyond this machine may be reached.
        corefile.write_text(f"""\
.:53 {{
    bind {node.NODE_IP}
    errors
    ready 127.0.0.1:{self._dns_ready_port}
    kubernetes {node.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self._client_kubeconfig("coredns", DNS_USER)}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
""")
        self._launch("coredns", [str(self.bin_dir / "coredns"), "-conf", str(corefile)])

    def _start_policy_agent(self, deadline: float) -> None:
        """kube-router's firewall alone (no routing, no service proxy, no CNI: the bridge and
        kube-proxy do those): it turns NetworkPolicies into iptables rules and ipsets, which
        :meth:`stop` removes with the node's other host changes (``node.restore_host``), not with
        kube-router's own ``--cleanup-config`` (it fails on a kernel without IPVS)."""
        comp = self._launch(POLICY_AGENT, [
            str(self.policy_agent),
            f"--kubeconfig={self._client_kubeconfig('policy-agent', POLICY_AGENT_USER)}",
            f"--hostname-override={self.node_name}",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--enable-cni=false",
            f"--service-cluster-ip-range={node.SERVICE_CIDR}",
            "--health-port=0",  # no listener on the machine's interfaces
            "--metrics-port=0",
            "--v=1",
        ])

        def synced() -> bool:
            return any(f":{POLICY_AGENT_CHAIN} " in line
                       for line in node.run("iptables-save", "-t", "filter", check=False).splitlines())

        self._wait(f"{POLICY_AGENT}'s firewall chains", synced, deadline, comp, interval=0.5)

    def _wait_settled(self, deadline: float) -> None:
        def default_sa():
            status, _ = self._api_get("/api/v1/namespaces/default/serviceaccounts/default")
            return status == 200

        self._wait("the default ServiceAccount (kube-controller-manager)", default_sa, deadline,
                   self._component("kube-controller-manager"))
        if not self.node:
            return

        def node_ready():
            status, body = self._api_get(f"/api/v1/nodes/{self.node_name}")
            if status != 200:
                return False
            conds = json.loads(body).get("status", {}).get("conditions") or []
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

        self._wait(f"node {self.node_name} Ready", node_ready, deadline, self._component("kubelet"))
        # The kubelet registers the node with the not-ready taint, which the node-lifecycle
        # controller lifts. That controller stays off (it would evict every pod when a busy
        # machine delays a heartbeat), so the taint is lifted here, once, as it would.
        self.kubectl("taint", "nodes", self.node_name, "node.kubernetes.io/not-ready:NoSchedule-", check=False)

        def dns_ready():
            conn = http.client.HTTPConnection("127.0.0.1", self._dns_ready_port, timeout=2)
            try:
                conn.request("GET", "/ready")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        self._wait("CoreDNS ready", dns_ready, deadline, self._component("coredns"))

    # ------------------------------------------------------------------ daemon mode

    def serve(self) -> int:
        """Run until SIGTERM/SIGINT (the ``modelplex cluster up`` supervisor)."""
        stop = {"flag": False}

        def on_signal(signum, frame):
            stop["flag"] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        (self.state_dir / "ready").write_text(json.dumps({
            "server": self.server, "kubeconfig": str(self.kubeconfig), "bin_dir": str(self.bin_dir),
            "containerd_socket": str(self.containerd_socket),
            "pids": {c.name: c.proc.pid for c in self.components if c.proc},
        }))
        code = 0
        try:
            while not stop["flag"]:
                for c in self.components:
                    if c.proc is not None and c.proc.poll() is not None:
                        self._say(f"{c.name} exited with code {c.proc.returncode}; stopping (log: {c.log})")
                        stop["flag"] = True
                        code = 1
                time.sleep(0.5)
        finally:
            (self.state_dir / "ready").unlink(missing_ok=True)
            undone = self.stop()
            self._say("host restored: " + (", ".join(undone) or "nothing to undo"))
        self._say("cluster stopped")
        return code


def clear_abandoned_node() -> list[str]:
    """Undo what a node whose processes are all gone left on the host (``node.abandoned_state``);
    returns what was undone."""
    state = node.abandoned_state()
    return restore_node_host(state) if state is not None else []


def restore_node_host(state_dir: Path) -> list[str]:
    """Undo the host changes of the node whose state is in ``state_dir`` (its processes stopped)."""
    snapshot = Path(state_dir) / "host-before.json"
    try:
        before = json.loads(snapshot.read_text())
    except (OSError, ValueError):
        return []
    undone = node.restore_host(Path(state_dir), before)
    snapshot.unlink()
    return undone


def _supervise(argv: Iterable[str]) -> int:
    """Entry point of the detached supervisor: ``python -m modelplex_cluster.controlplane``."""
    import argparse

    parser = argparse.ArgumentParser(prog="modelplex-control-plane")
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--policy-agent", default=None, help="kube-router's binary (built when not given)")
    args = parser.parse_args(list(argv))
    cp = ControlPlane(Path(args.bin_dir), Path(args.state_dir),
                      policy_agent=Path(args.policy_agent) if args.policy_agent else None)
    try:
        return cp.serve()
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1:]))
