"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager and Modelplex's test kubelet.

The binaries come from ``hack/control-plane/build.sh`` (built from their Go
modules and cached). Everything listens on 127.0.0.1 on free ports, with
certificates made here; RBAC is on and real.

    cp = ControlPlane(build_binaries())
    cp.start()          # returns once the API answers and the node is Ready
    ... cp.kubeconfig, cp.env(), cp.api_client(), cp.kubectl("get", "ns") ...
    cp.stop()
"""

from __future__ import annotations

import base64
import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

import yaml

from modelplex_cluster import certs

NODE_NAME = "modelplex-node"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm")


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


def build_script() -> Path:
    env = os.environ.get("MODELPLEX_CONTROL_PLANE_BUILD")
    if env:
        return Path(env)
    root = repo_root()
    if root is None:
        raise ControlPlaneError(
            "cannot find hack/control-plane/build.sh (modelplex is not running from its repository); "
            "set MODELPLEX_CONTROL_PLANE_BUILD to the script or MODELPLEX_CONTROL_PLANE_BIN to a folder "
            "holding the binaries"
        )
    return root / "hack" / "control-plane" / "build.sh"


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
    script = build_script()
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write_kubeconfig(
    path: Path,
    server: str,
    ca_pem: bytes,
    *,
    user: str,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
    namespace: str | None = None,
    cluster: str = "modelplex",
) -> Path:
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


_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


def _child_setup(death_signal: int = signal.SIGTERM) -> None:
    """Run in the child before exec: own process group, and die with the parent."""
    os.setsid()
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(death_signal))


def _child_setup_kill() -> None:
    _child_setup(signal.SIGKILL)


def spawn(argv: list[str], log_path: Path, *, env: dict | None = None, cwd: str | Path | None = None,
          die_with_parent: bool = True, death_signal: int = signal.SIGTERM) -> subprocess.Popen:
    """Start ``argv`` in its own process group with output appended to ``log_path``.

    With ``die_with_parent`` the child gets ``death_signal`` when the spawning
    thread's process dies (Linux PR_SET_PDEATHSIG), so a killed test run leaves
    nothing behind.
    """
    setup = _child_setup_kill if death_signal == signal.SIGKILL else _child_setup
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=setup if die_with_parent else None,
            start_new_session=not die_with_parent,
        )


def stop_process(proc: subprocess.Popen, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """SIGTERM the process group, wait, then SIGKILL it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group, if any
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class PodProcess:
    """One container process the test kubelet runs for a pod."""

    namespace: str
    pod: str
    container: str
    pid: int | None
    pod_ip: str | None
    log: Path | None
    phase: str | None = None


# --------------------------------------------------------------------------- the control plane


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager (+ the test kubelet) on loopback.

    ``state_dir`` holds certificates, etcd data, kubeconfigs and logs (a fresh
    temporary folder when not given). ``workdir`` is the working directory of
    pod processes (the repository root by default). ``pod_ip_prefix`` ("127.N")
    picks the /16 from which the kubelet gives pods their addresses.
    A temporary state dir is removed by :meth:`stop` unless ``keep_state``.
    """

    bin_dir: Path
    state_dir: Path | None = None
    workdir: Path | None = None
    kubelet: bool = True
    node_name: str = NODE_NAME
    pod_ip_prefix: str = "127.0"
    log_stream: IO[str] | None = None
    keep_state: bool = False  # keep a temporary state dir (made when none was given) after stop()
    components: list[Component] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bin_dir = Path(self.bin_dir)
        self._own_state = self.state_dir is None
        self.state_dir = Path(self.state_dir or tempfile.mkdtemp(prefix="modelplex-control-plane-"))
        self.workdir = Path(self.workdir or repo_root() or os.getcwd())
        self.pki_dir = self.state_dir / "pki"
        self.logs_dir = self.state_dir / "logs"
        self.kubelet_dir = self.state_dir / "kubelet"
        self.kubeconfig = self.state_dir / "kubeconfig"
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

    def pod_dirs(self, namespace: str, name: str) -> list[Path]:
        """The kubelet's folders for pods of that name, newest first (one per pod UID)."""
        found = list((self.kubelet_dir / "pods").glob(f"{namespace}_{name}_*"))
        return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)

    def pod_log_path(self, namespace: str, name: str, container: str | None = None) -> Path:
        """The log file of a pod's container (first container when not named)."""
        dirs = self.pod_dirs(namespace, name)
        if not dirs:
            raise ControlPlaneError(f"the kubelet has no folder for pod {namespace}/{name} in {self.kubelet_dir}")
        if container:
            return dirs[0] / f"{container}.log"
        logs = sorted(dirs[0].glob("*.log"))
        if not logs:
            raise ControlPlaneError(f"no container log for pod {namespace}/{name} in {dirs[0]}")
        return logs[0]

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        return self.pod_log_path(namespace, name, container).read_text(errors="replace")

    def pod_processes(self) -> list[PodProcess]:
        """What the kubelet is running now (from its ``processes.json``)."""
        path = self.kubelet_dir / "processes.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        return [PodProcess(**item) for item in data]

    def service_endpoints(self, namespace: str, service: str, port: str | int | None = None) -> list[str]:
        """``ip:port`` of the ready pods behind a Service, sorted.

        There is no kube-proxy and no cluster DNS here, and the apiserver refuses
        loopback addresses in Endpoints/EndpointSlices, so a Service's ClusterIP,
        name and endpoints do not work. This resolves the Service the way
        kube-proxy would: its selector, the pods' readiness, the target port.
        ``port`` picks a Service port by name or number (the first when not given).
        """
        svc = json.loads(self.kubectl("get", "service", service, "-n", namespace, "-o", "json").stdout)
        spec = svc.get("spec") or {}
        selector = spec.get("selector") or {}
        svc_ports = spec.get("ports") or []
        chosen = next((p for p in svc_ports if port is None or p.get("name") == port or p.get("port") == port), None)
        if chosen is None or not selector:
            return []
        target = chosen.get("targetPort", chosen.get("port"))
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        pods = json.loads(self.kubectl("get", "pods", "-n", namespace, "-l", label_selector, "-o", "json").stdout)
        result = []
        for pod in pods.get("items", []):
            status = pod.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            if not ready or not status.get("podIP") or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            number = target
            if isinstance(target, str) and not target.isdigit():
                number = next((cp.get("containerPort") for c in pod["spec"].get("containers", [])
                               for cp in c.get("ports") or [] if cp.get("name") == target), None)
                if number is None:
                    continue
            result.append(f"{status['podIP']}:{int(number)}")
        return sorted(result)

    def log_paths(self) -> dict[str, Path]:
        """Component name -> log file (etcd, kube-apiserver, kube-controller-manager, kubelet)."""
        return {c.name: c.log for c in self.components}

    def describe_logs(self, lines: int = 20) -> str:
        """The tail of every component log and pod log, for failure messages."""
        parts = []
        for c in self.components:
            parts.append(f"--- {c.name}: {c.log}\n{tail(c.log, lines)}")
        for log in sorted((self.kubelet_dir / "pods").glob("*/*.log")):
            parts.append(f"--- pod log {log}\n{tail(log, lines)}")
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

    def start(self, timeout: float = 180.0) -> "ControlPlane":
        """Start everything; returns once the API is ready, the ``default``
        ServiceAccount exists and (with the kubelet) the node is Ready."""
        if self._started:
            return self
        missing = [t for t in TOOLS[:3] if not (self.bin_dir / t).is_file()]
        if missing:
            raise ControlPlaneError(f"{self.bin_dir} lacks {', '.join(missing)}; run hack/control-plane/build.sh")
        self._started = True
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            self._prepare()
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self._start_controller_manager()
            if self.kubelet:
                self._start_kubelet()
            self._wait_settled(deadline)
        except BaseException as exc:
            details = self.describe_logs()
            self.keep_state = True  # keep the logs named in the error
            self.stop()
            if isinstance(exc, ControlPlaneError):
                raise ControlPlaneError(f"{exc}\nstate dir: {self.state_dir}\n{details}") from None
            raise
        self._say(f"control plane ready in {time.monotonic() - t0:.1f}s: {self.server} (state in {self.state_dir})")
        return self

    def stop(self) -> None:
        """Stop the kubelet (and its pods), the controller-manager, the apiserver and etcd, in that order."""
        for comp in reversed(self.components):
            if comp.proc is not None:
                stop_process(comp.proc, timeout=20 if comp.name == "kubelet" else 10)
        self._started = False
        if self._own_state and not self.keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def running(self) -> bool:
        return bool(self.components) and all(c.running() for c in self.components)

    def check_alive(self) -> None:
        for c in self.components:
            if c.proc is not None and c.proc.poll() is not None:
                raise ControlPlaneError(f"{c.name} exited with code {c.proc.returncode}; log: {c.log}\n{tail(c.log)}")

    # ------------------------------------------------------------------ steps

    def _prepare(self) -> None:
        for d in (self.pki_dir, self.logs_dir, self.kubelet_dir, self.state_dir / "etcd"):
            d.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "etcd").chmod(0o700)
        ca = certs.CertificateAuthority(self.pki_dir)
        self._ca = ca
        self._serving = ca.issue(
            "apiserver", "kube-apiserver", server=True,
            server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                          "kubernetes.default.svc.cluster.local"),
            server_ips=("127.0.0.1", "10.96.0.1"),
        )
        self._admin = ca.issue("admin", "modelplex-admin", organization="system:masters", client=True)
        self._kcm = ca.issue("controller-manager", "system:kube-controller-manager", client=True)
        self._kubelet_client = ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organization="system:masters", client=True
        )
        self._kubelet_serving = ca.issue(
            "kubelet", f"system:node:{self.node_name}", organization="system:nodes",
            server=True, client=True, server_names=("localhost", self.node_name), server_ips=("127.0.0.1",),
        )
        # for the aggregation layer (and so that components find a requestheader CA)
        self._front_proxy = ca.issue("front-proxy-client", "front-proxy-client", client=True)
        self._sa_key, self._sa_pub = certs.service_account_keys(self.pki_dir)
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.api_port = free_port()
        self.kcm_port = free_port()
        self.kubelet_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        write_kubeconfig(self.kubeconfig, self.server, ca.pem, user="modelplex-admin",
                         client_cert=self._admin.cert, client_key=self._admin.key)
        self._kcm_kubeconfig = write_kubeconfig(
            self.pki_dir / "controller-manager.kubeconfig", self.server, ca.pem,
            user="system:kube-controller-manager", client_cert=self._kcm.cert, client_key=self._kcm.key,
        )
        (self.state_dir / "endpoints.json").write_text(json.dumps({
            "server": self.server, "etcd": f"http://127.0.0.1:{self.etcd_port}",
            "kubeconfig": str(self.kubeconfig), "bin_dir": str(self.bin_dir),
        }, indent=2))

    def _launch(self, name: str, argv: list[str], env: dict | None = None) -> Component:
        comp = Component(name, argv, self.logs_dir / f"{name}.log")
        with open(comp.log, "ab") as f:
            f.write(f"==> {' '.join(argv)}\n".encode())
        # An orphaned etcd/apiserver/controller-manager is killed outright; the
        # kubelet gets SIGTERM so that it can stop its pods.
        death = signal.SIGTERM if name == "kubelet" else signal.SIGKILL
        comp.proc = spawn(argv, comp.log, env=env, cwd=self.state_dir, death_signal=death)
        self.components.append(comp)
        pid_dir = self.state_dir / "pids"
        pid_dir.mkdir(exist_ok=True)
        (pid_dir / f"{name}.pid").write_text(f"{comp.proc.pid}\n")
        return comp

    def _component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def _wait(self, what: str, check, deadline: float, comp: Component | None = None, interval: float = 0.25):
        last_err = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                result = check()
                if result:
                    return result
            except Exception as exc:  # noqa: BLE001 - keep polling, report the last error
                last_err = exc
            time.sleep(interval)
        where = f"; log: {comp.log}" if comp else ""
        raise ControlPlaneError(f"timed out waiting for {what} (last error: {last_err!r}){where}")

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
        conn = http.client.HTTPSConnection("127.0.0.1", self.api_port, timeout=timeout, context=self._admin_ssl())
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
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--cert-dir={p}",
            f"--tls-cert-file={self._serving.cert}",
            f"--tls-private-key-file={self._serving.key}",
            f"--client-ca-file={self.ca_file}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self._sa_pub}",
            f"--service-account-signing-key-file={self._sa_key}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # `kubectl logs` reaches the test kubelet's log server with this client certificate.
            f"--kubelet-client-certificate={self._kubelet_client.cert}",
            f"--kubelet-client-key={self._kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca_file}",
            "--kubelet-preferred-address-types=InternalIP",
            # The apiserver refuses loopback addresses in Endpoints, its own included.
            "--endpoint-reconciler-type=none",
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

    def _start_controller_manager(self) -> None:
        kc = self._kcm_kubeconfig
        self._launch("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.kcm_port}",
            f"--cert-dir={self.pki_dir / 'controller-manager-serving'}",
            f"--service-account-private-key-file={self._sa_key}",
            f"--root-ca-file={self.ca_file}",
            f"--cluster-signing-cert-file={self.ca_file}",
            f"--cluster-signing-key-file={self._ca.key_path}",
            "--use-service-account-credentials=true",
            # No node IPAM (no pod CIDRs here) and no node lifecycle (the test
            # kubelet's node never goes away; a busy laptop must not evict pods).
            # No endpoints controllers: pod IPs are loopback addresses, which the
            # apiserver refuses in Endpoints and EndpointSlices.
            "--controllers=*,-node-ipam-controller,-node-lifecycle-controller,-endpoints-controller,"
            "-endpointslice-controller,-endpointslice-mirroring-controller",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            "--cluster-name=modelplex",
            "--v=1",
        ])

    def _start_kubelet(self) -> None:
        argv = [
            sys.executable, "-m", "modelplex_cluster.kubelet",
            f"--kubeconfig={self.kubeconfig}",
            f"--state-dir={self.kubelet_dir}",
            f"--node-name={self.node_name}",
            f"--workdir={self.workdir}",
            f"--pod-ip-prefix={self.pod_ip_prefix}",
            f"--server={self.server}",
            f"--ca-file={self.ca_file}",
            f"--serve-port={self.kubelet_port}",
            f"--serve-cert={self._kubelet_serving.cert}",
            f"--serve-key={self._kubelet_serving.key}",
        ]
        env = dict(os.environ)
        # The kubelet must import this very package, wherever it was loaded from.
        pkg_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
        env.pop("KUBECONFIG", None)
        self._launch("kubelet", argv, env=env)

    def _wait_settled(self, deadline: float) -> None:
        def default_sa():
            status, _ = self._api_get("/api/v1/namespaces/default/serviceaccounts/default")
            return status == 200

        self._wait("the default ServiceAccount (kube-controller-manager)", default_sa, deadline,
                   self._component("kube-controller-manager"))
        if not self.kubelet:
            return

        def node_ready():
            status, body = self._api_get(f"/api/v1/nodes/{self.node_name}")
            if status != 200:
                return False
            conds = json.loads(body).get("status", {}).get("conditions") or []
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

        self._wait(f"node {self.node_name} Ready (test kubelet)", node_ready, deadline, self._component("kubelet"))

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
            self.stop()
        self._say("control plane stopped")
        return code


def _supervise(argv: Iterable[str]) -> int:
    """Entry point of the detached supervisor: ``python -m modelplex_cluster.controlplane``."""
    import argparse

    parser = argparse.ArgumentParser(prog="modelplex-control-plane")
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--workdir")
    parser.add_argument("--pod-ip-prefix", default="127.0")
    parser.add_argument("--no-kubelet", action="store_true")
    args = parser.parse_args(list(argv))
    cp = ControlPlane(
        Path(args.bin_dir), Path(args.state_dir), workdir=Path(args.workdir) if args.workdir else None,
        kubelet=not args.no_kubelet, pod_ip_prefix=args.pod_ip_prefix,
    )
    try:
        return cp.serve()
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1:]))
