"""Modelplex's test kubelet: runs pods as local processes on loopback addresses.

It is a separate process (``python -m modelplex_cluster.kubelet``) that talks to
the apiserver with the ``kubernetes`` client and:

* registers one Node (Ready) and binds every unscheduled pod to it (no
  kube-scheduler runs; resources are not checked);
* runs each container's ``command`` + ``args`` (``$(VAR)`` expanded) as a local
  process in the project's environment: the folder of this Python interpreter
  comes first on PATH, cwd is the configured work dir; images are not pulled;
* gives each pod its own address 127.N.x.y (env ``POD_IP`` and the downward API
  ``status.podIP``), so two pods may both listen on port 9000;
* resolves env (``value``, downward-API ``fieldRef``/``resourceFieldRef``,
  ConfigMap and Secret key refs, ``envFrom``), writes ConfigMap, Secret,
  downward-API, projected and emptyDir volumes to a folder per pod and rewrites
  any env value or argument that starts with a volume's ``mountPath`` to that
  folder (``MODELPLEX_SPEC=/etc/modelplex/spec.yaml`` -> ``<pod dir>/volumes/...``);
* requests a token for the pod's ServiceAccount (TokenRequest, bound to the pod)
  and passes ``KUBECONFIG`` naming a kubeconfig with it, so RBAC applies for real;
* reports podIP, phase, containerStatuses and the Ready condition (from the
  readiness probe: httpGet, tcpSocket or exec; no probe means ready once started);
* restarts containers per ``restartPolicy`` with a short backoff;
* on deletion sends SIGTERM to the process group, SIGKILL after the grace
  period, then deletes the pod object for good (grace period 0);
* serves ``/containerLogs`` over TLS so ``kubectl logs [-f]`` works.

Container output goes to ``<state dir>/pods/<ns>_<pod>_<uid8>/<container>.log``.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import http.server
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from pathlib import Path

from modelplex_cluster.controlplane import _child_setup, write_kubeconfig

log = logging.getLogger("modelplex.kubelet")

TOKEN_SECONDS = 48 * 3600
MAX_BACKOFF = 20.0
PROBE_INTERVAL_CAP = 1.0  # poll probes at least this often (faster than periodSeconds; tests want speed)
SMP = "application/strategic-merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"{status}: {body[:500]}")
        self.status = status
        self.body = body


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- API access


class Api:
    """The few calls the kubelet makes, as raw JSON (portable across client versions)."""

    def __init__(self, kubeconfig: str):
        from kubernetes import client, config

        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api_client)
        from kubernetes.client.rest import ApiException

        self._ApiException = ApiException

    def _call(self, fn, *args, **kwargs):
        kwargs["_preload_content"] = False
        kwargs.setdefault("_request_timeout", 30)
        try:
            resp = fn(*args, **kwargs)
        except self._ApiException as exc:
            raise ApiError(exc.status or 0, str(exc.body or exc.reason)) from None
        status = getattr(resp, "status", 200)
        data = resp.data if hasattr(resp, "data") else resp.read()
        text = data.decode() if isinstance(data, bytes) else str(data)
        if not 200 <= int(status) <= 299:
            raise ApiError(int(status), text)
        return json.loads(text) if text else {}

    def list_pods(self) -> dict:
        return self._call(self.core.list_pod_for_all_namespaces)

    def watch_pods(self, resource_version: str, timeout: int = 60):
        """Yield (type, object) events of all pods; returns at the server timeout."""
        resp = self.core.list_pod_for_all_namespaces(
            watch=True, resource_version=resource_version, timeout_seconds=timeout,
            allow_watch_bookmarks=True, _preload_content=False, _request_timeout=timeout + 15,
        )
        try:
            if not 200 <= int(getattr(resp, "status", 200)) <= 299:
                raise ApiError(int(resp.status), resp.data.decode(errors="replace"))
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        yield event.get("type"), event.get("object") or {}
        finally:
            resp.release_conn()

    def get_pod(self, ns, name):
        return self._call(self.core.read_namespaced_pod, name, ns)

    def bind(self, ns, name, uid, node):
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        return self._call(self.core.create_namespaced_pod_binding, name, ns, body)

    def patch_pod_status(self, ns, name, status):
        return self._call(self.core.patch_namespaced_pod_status, name, ns, {"status": status}, _content_type=SMP)

    def delete_pod_now(self, ns, name, uid):
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        return self._call(self.core.delete_namespaced_pod, name, ns, body=body, grace_period_seconds=0)

    def config_map(self, ns, name):
        return self._call(self.core.read_namespaced_config_map, name, ns)

    def secret(self, ns, name):
        return self._call(self.core.read_namespaced_secret, name, ns)

    def service_account(self, ns, name):
        return self._call(self.core.read_namespaced_service_account, name, ns)

    def token(self, ns, sa, pod_name, pod_uid, audiences=None, seconds=TOKEN_SECONDS) -> str:
        spec = {"expirationSeconds": seconds,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}}
        if audiences:
            spec["audiences"] = audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        result = self._call(self.core.create_namespaced_service_account_token, sa, ns, body)
        return result["status"]["token"]

    def get_node(self, name):
        return self._call(self.core.read_node, name)

    def create_node(self, body):
        return self._call(self.core.create_node, body)

    def patch_node_status(self, name, status):
        return self._call(self.core.patch_node_status, name, {"status": status}, _content_type=SMP)


# --------------------------------------------------------------------------- small pieces


class IPAllocator:
    """Hands out 127.N.x.y addresses round-robin (never .0, .1 or .255 in the last octet)."""

    def __init__(self, prefix: str):
        parts = prefix.split(".")
        if len(parts) != 2 or parts[0] != "127" or not 0 <= int(parts[1]) <= 255:
            raise ValueError(f"pod IP prefix must look like 127.N, got {prefix!r}")
        self.prefix = prefix
        self._next = 0
        self._used: set[str] = set()
        self._lock = threading.Lock()

    def _addr(self, i: int) -> str:
        third, fourth = divmod(i, 253)
        return f"{self.prefix}.{third}.{fourth + 2}"

    def allocate(self) -> str:
        with self._lock:
            for _ in range(256 * 253):
                ip = self._addr(self._next)
                self._next = (self._next + 1) % (256 * 253)
                if ip not in self._used:
                    self._used.add(ip)
                    return ip
        raise RuntimeError("no pod IPs left")

    def release(self, ip: str | None) -> None:
        with self._lock:
            self._used.discard(ip)


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(value: str, mapping: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: $$ escapes, unknown references stay as they are."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return mapping[name] if name in mapping else m.group(0)

    return _VAR.sub(sub, value)


def parse_quantity(q: str) -> float:
    q = str(q).strip()
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * suffixes[suffix]
    return float(q)


NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "250", "ephemeral-storage": "100Gi", "nvidia.com/gpu": "8"}


def field_value(pod: dict, path: str, pod_ip: str) -> str:
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": "127.0.0.1",
        "status.hostIPs": "127.0.0.1",
    }
    if path not in simple:
        raise PrepareError(f"unsupported fieldRef {path!r}")
    return simple[path]


def resource_value(container: dict, ref: dict) -> str:
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    res = container.get("resources") or {}
    value = (res.get(kind) or {}).get(name)
    if value is None and kind == "requests":
        value = (res.get("limits") or {}).get(name)
    if value is None:
        value = NODE_CAPACITY.get(name, "0")
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(int(math.ceil(parse_quantity(value) / divisor)))


class PrepareError(Exception):
    """The pod cannot start yet (missing ConfigMap, unsupported field ...); retried."""


def _mode(file_mode, default_mode) -> int:
    if file_mode is not None:
        return int(file_mode)
    return int(default_mode) if default_mode is not None else 0o644


# --------------------------------------------------------------------------- containers


class ContainerRun:
    """One container of a pod: its process, restarts and probe state."""

    def __init__(self, worker: "PodWorker", spec: dict, init: bool = False):
        self.worker = worker
        self.spec = spec
        self.name = spec["name"]
        self.init = init
        self.log_path = worker.pod_dir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None
        self.restart_count = 0
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.started_at: str | None = None
        self.start_mono = 0.0
        self.next_start = 0.0
        self.backoff = 0.5
        self.done = False  # terminated for good (no restart)
        self.exit_handled = False  # the current process's exit was seen
        self.ready = False
        self.probe_ok = 0
        self.probe_fail = 0
        self.next_probe = 0.0
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.cwd: str = ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running else None

    def start(self) -> None:
        argv = list(self.argv)
        exe = shutil.which(argv[0], path=self.env.get("PATH")) if "/" not in argv[0] else argv[0]
        if not exe:
            raise PrepareError(f"executable {argv[0]!r} not found on PATH={self.env.get('PATH')}")
        argv[0] = exe
        with open(self.log_path, "ab") as f:
            f.write(f"==> {now_rfc3339()} test kubelet starting (restart {self.restart_count}): "
                    f"{' '.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.cwd, preexec_fn=_child_setup,
            )
        self.exit_handled = False
        self.started_at = now_rfc3339()
        self.start_mono = time.monotonic()
        self.state = {"running": {"startedAt": self.started_at}}
        self.ready = False
        self.probe_ok = self.probe_fail = 0
        probe = self.spec.get("readinessProbe") or {}
        self.next_probe = time.monotonic() + float(probe.get("initialDelaySeconds") or 0)
        log.info("started %s/%s[%s] pid %s: %s", self.worker.ns, self.worker.name, self.name, self.proc.pid, argv)

    def stop(self, grace: float) -> None:
        if self.proc is None:
            return
        proc = self.proc
        if proc.poll() is None:
            with open(self.log_path, "ab") as f:
                f.write(f"==> {now_rfc3339()} test kubelet: stopping the process (SIGTERM, "
                        f"SIGKILL after {grace:.0f}s)\n".encode())
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(max(grace, 0.1))
            except subprocess.TimeoutExpired:
                log.info("%s/%s[%s] ignored SIGTERM for %.0fs; SIGKILL", self.worker.ns, self.worker.name,
                         self.name, grace)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.exit_handled = True
        self._record_exit(proc.returncode if proc.returncode is not None else -9)
        self.ready = False

    def _record_exit(self, code: int) -> None:
        finished = now_rfc3339()
        self.state = {"terminated": {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.started_at or finished, "finishedAt": finished,
            "containerID": f"modelplex://{self.proc.pid if self.proc else 0}",
        }}
        if code < 0:
            self.state["terminated"]["signal"] = -code

    def check_exit(self, restart_policy: str) -> bool:
        """Handle a process that exited; returns True when something changed."""
        if self.proc is None or self.proc.poll() is None or self.exit_handled:
            return False
        self.exit_handled = True
        code = self.proc.returncode
        with open(self.log_path, "ab") as f:
            f.write(f"==> {now_rfc3339()} test kubelet: process exited with code {code}\n".encode())
        self._record_exit(code)
        self.ready = False
        restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
        if self.init and code == 0:
            restart = False
        if restart:
            if time.monotonic() - self.start_mono > 60:
                self.backoff = 0.5
            self.last_state = self.state
            self.next_start = time.monotonic() + self.backoff
            self.state = {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": f"back-off {self.backoff:.1f}s restarting failed container"}}
            self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        else:
            self.done = True
        return True

    def maybe_restart(self) -> bool:
        if self.done or self.running or self.proc is None or time.monotonic() < self.next_start:
            return False
        self.restart_count += 1
        try:
            self.start()
        except (PrepareError, OSError) as exc:
            self.state = {"waiting": {"reason": "RunContainerError", "message": str(exc)}}
            self.next_start = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        return True

    # probes

    def probe(self) -> bool:
        """Run the readiness probe when due; returns True when readiness changed."""
        if not self.running:
            return False
        probe = self.spec.get("readinessProbe")
        if not probe:
            changed = not self.ready
            self.ready = True
            return changed
        now = time.monotonic()
        if now < self.next_probe:
            return False
        self.next_probe = now + min(float(probe.get("periodSeconds") or 10), PROBE_INTERVAL_CAP)
        ok = self._run_probe(probe)
        if ok:
            self.probe_ok += 1
            self.probe_fail = 0
        else:
            self.probe_fail += 1
            self.probe_ok = 0
        before = self.ready
        if ok and self.probe_ok >= int(probe.get("successThreshold") or 1):
            self.ready = True
        elif not ok and (not self.ready or self.probe_fail >= int(probe.get("failureThreshold") or 3)):
            self.ready = False
        return before != self.ready

    def _port(self, port) -> int:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for p in self.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"unknown named port {port!r}")

    def _run_probe(self, probe: dict) -> bool:
        timeout = float(probe.get("timeoutSeconds") or 1)
        try:
            if "httpGet" in probe:
                g = probe["httpGet"]
                host = g.get("host") or self.worker.ip
                port = self._port(g.get("port"))
                cls = http.client.HTTPSConnection if (g.get("scheme") or "HTTP").upper() == "HTTPS" else None
                if cls:
                    conn = cls(host, port, timeout=timeout, context=ssl._create_unverified_context())
                else:
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                try:
                    headers = {h["name"]: h["value"] for h in g.get("httpHeaders") or []}
                    headers.setdefault("User-Agent", "kube-probe/modelplex-test-kubelet")
                    conn.request("GET", g.get("path") or "/", headers=headers)
                    resp = conn.getresponse()
                    resp.read()
                    return 200 <= resp.status < 400
                finally:
                    conn.close()
            if "tcpSocket" in probe:
                t = probe["tcpSocket"]
                with socket.create_connection((t.get("host") or self.worker.ip, self._port(t.get("port"))),
                                              timeout=timeout):
                    return True
            if "exec" in probe:
                cmd = probe["exec"].get("command") or []
                r = subprocess.run(cmd, env=self.env, cwd=self.cwd, timeout=timeout,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                return r.returncode == 0
        except Exception:  # noqa: BLE001 - any failure is a failed probe
            return False
        return True  # grpc and others: not supported, count as passing

    def status(self) -> dict:
        st = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.running,
            "state": self.state,
        }
        if self.proc is not None:
            st["containerID"] = f"modelplex://{self.proc.pid}"
        if self.last_state:
            st["lastState"] = self.last_state
        return st


# --------------------------------------------------------------------------- pods


class PodWorker(threading.Thread):
    """Owns one pod (by UID) from first sight until its processes are gone."""

    def __init__(self, kubelet: "Kubelet", pod: dict):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kubelet = kubelet
        self.api = kubelet.api
        self.pod = pod
        self.ns = meta["namespace"]
        self.name = meta["name"]
        self.uid = meta["uid"]
        self.pod_dir = kubelet.state_dir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.ip: str | None = None
        self.wake = threading.Event()
        self.gone = False  # the pod object disappeared
        self.containers: list[ContainerRun] = []
        self.init_containers: list[ContainerRun] = []
        self.initialized = False
        self.prepared = False
        self.waiting_reason: tuple[str, str] | None = None
        self.conditions: dict[str, tuple[str, str]] = {}
        self.start_time: str | None = None
        self.last_status: dict | None = None
        self.finished = threading.Event()

    # -- inputs from the kubelet

    def update(self, pod: dict) -> None:
        self.pod = pod
        self.wake.set()

    def mark_gone(self) -> None:
        self.gone = True
        self.wake.set()

    @property
    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    @property
    def restart_policy(self) -> str:
        return self.pod["spec"].get("restartPolicy") or "Always"

    def all_runs(self) -> list[ContainerRun]:
        return self.init_containers + self.containers

    # -- main loop

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # noqa: BLE001
            log.error("pod worker %s/%s crashed:\n%s", self.ns, self.name, traceback.format_exc())
            for c in self.all_runs():
                c.stop(1)
        finally:
            self.kubelet.ips.release(self.ip)
            self.kubelet.worker_done(self)
            self.finished.set()

    def _should_stop(self) -> bool:
        return self.gone or self.deleting or self.kubelet.stopping.is_set()

    def _run(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self.ip = self.kubelet.ips.allocate()
        self.start_time = now_rfc3339()
        spec = self.pod["spec"]
        self.init_containers = [ContainerRun(self, c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [ContainerRun(self, c) for c in spec.get("containers") or []]
        self._set_condition("PodScheduled", "True")
        self._set_condition("Initialized", "False" if self.init_containers else "True")
        self._set_condition("ContainersReady", "False")
        self._set_condition("Ready", "False")
        self.push_status()

        # Prepare volumes, env and credentials; retry while something is missing.
        while not self._should_stop():
            try:
                self._prepare()
                self.prepared = True
                self.waiting_reason = None
                break
            except PrepareError as exc:
                self.waiting_reason = ("CreateContainerConfigError", str(exc))
                self.push_status()
                self.wake.wait(1.0)
                self.wake.clear()
        self._set_condition("PodReadyToStartContainers", "True" if self.prepared else "False")

        while not self._should_stop():
            changed = self._step()
            if changed:
                self.push_status()
            self.wake.wait(0.25)
            self.wake.clear()

        self._teardown()

    def _step(self) -> bool:
        changed = False
        policy = self.restart_policy
        if not self.initialized:
            for c in self.init_containers:
                if c.done and c.state.get("terminated", {}).get("exitCode") == 0:
                    continue
                if c.proc is None:
                    changed |= self._first_start(c)
                changed |= c.check_exit(policy if policy != "Always" else "OnFailure")
                changed |= c.maybe_restart()
                if c.done and c.state.get("terminated", {}).get("exitCode") != 0:
                    # init container failed for good: the pod fails
                    for app in self.containers:
                        app.done = True
                    self.initialized = True
                    return True
                return changed
            self.initialized = True
            self._set_condition("Initialized", "True")
            changed = True
        for c in self.containers:
            if c.proc is None and not c.done:
                changed |= self._first_start(c)
            changed |= c.check_exit(policy)
            changed |= c.maybe_restart()
            changed |= c.probe()
        all_ready = bool(self.containers) and all(c.ready for c in self.containers)
        changed |= self._set_condition("ContainersReady", "True" if all_ready else "False")
        gates_ok = self._readiness_gates_ok()
        changed |= self._set_condition("Ready", "True" if all_ready and gates_ok else "False")
        return changed

    def _first_start(self, c: ContainerRun) -> bool:
        if time.monotonic() < c.next_start:
            return False
        try:
            c.start()
        except (PrepareError, OSError) as exc:
            c.state = {"waiting": {"reason": "RunContainerError", "message": str(exc)}}
            c.next_start = time.monotonic() + c.backoff
            c.backoff = min(c.backoff * 2, MAX_BACKOFF)
            if self.restart_policy == "Never":
                c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": str(exc),
                                          "startedAt": now_rfc3339(), "finishedAt": now_rfc3339()}}
                c.done = True
        self.kubelet.write_processes()
        return True

    def _readiness_gates_ok(self) -> bool:
        gates = self.pod["spec"].get("readinessGates") or []
        if not gates:
            return True
        have = {c["type"]: c.get("status") for c in self.pod.get("status", {}).get("conditions") or []}
        return all(have.get(g["conditionType"]) == "True" for g in gates)

    def _set_condition(self, ctype: str, status: str) -> bool:
        old = self.conditions.get(ctype)
        if old and old[0] == status:
            return False
        self.conditions[ctype] = (status, now_rfc3339())
        return True

    def _phase(self) -> str:
        apps = self.containers
        if self.initialized and apps and all(c.done for c in apps):
            codes = [c.state.get("terminated", {}).get("exitCode", 1) for c in apps]
            init_failed = any(c.done and c.state.get("terminated", {}).get("exitCode") not in (0, None)
                              for c in self.init_containers)
            return "Succeeded" if all(code == 0 for code in codes) and not init_failed else "Failed"
        if self.initialized and any(c.proc is not None for c in apps):
            return "Running"
        return "Pending"

    def build_status(self) -> dict:
        statuses = []
        for c in self.containers:
            st = c.status()
            if self.waiting_reason and c.proc is None:
                st["state"] = {"waiting": {"reason": self.waiting_reason[0], "message": self.waiting_reason[1]}}
            statuses.append(st)
        status = {
            "phase": self._phase(),
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": [
                {"type": t, "status": s, "lastTransitionTime": ts, "lastProbeTime": None}
                for t, (s, ts) in self.conditions.items()
            ],
            "containerStatuses": statuses,
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        return status

    def push_status(self) -> None:
        status = self.build_status()
        if status == self.last_status:
            return
        try:
            self.api.patch_pod_status(self.ns, self.name, status)
            self.last_status = status
        except ApiError as exc:
            if exc.status == 404:
                self.gone = True
            else:
                log.warning("status update of %s/%s failed: %s", self.ns, self.name, exc)
        self.kubelet.write_processes()

    def _teardown(self) -> None:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if self.kubelet.stopping.is_set():
            grace = min(float(grace), 5.0)
        runs = [c for c in self.all_runs() if c.running]
        threads = [threading.Thread(target=c.stop, args=(float(grace),)) for c in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.kubelet.write_processes()
        if self.deleting and not self.gone and not self.kubelet.stopping.is_set():
            try:
                self.api.delete_pod_now(self.ns, self.name, self.uid)
                log.info("deleted pod %s/%s", self.ns, self.name)
            except ApiError as exc:
                if exc.status not in (404, 409):
                    log.warning("final delete of %s/%s failed: %s", self.ns, self.name, exc)

    # -- preparing env, volumes, credentials

    def _prepare(self) -> None:
        pod = self.pod
        spec = pod["spec"]
        vol_root = self.pod_dir / "volumes"
        vol_root.mkdir(exist_ok=True)
        token = self._credentials(spec)
        volumes: dict[str, Path] = {}
        for vol in spec.get("volumes") or []:
            volumes[vol["name"]] = self._write_volume(vol, vol_root, token)
        for c in self.init_containers + self.containers:
            self._prepare_container(c, volumes)

    def _credentials(self, spec: dict) -> str | None:
        sa = spec.get("serviceAccountName") or "default"
        automount = spec.get("automountServiceAccountToken")
        if automount is None:
            try:
                automount = self.api.service_account(self.ns, sa).get("automountServiceAccountToken", True)
            except ApiError as exc:
                raise PrepareError(f"service account {self.ns}/{sa}: {exc}") from None
        kubeconfig = self.pod_dir / "kubeconfig"
        ca = self.kubelet.ca_pem
        token = None
        if automount is not False:
            try:
                token = self.api.token(self.ns, sa, self.name, self.uid)
            except ApiError as exc:
                raise PrepareError(f"token for service account {self.ns}/{sa}: {exc}") from None
            write_kubeconfig(kubeconfig, self.kubelet.server, ca, user=f"system:serviceaccount:{self.ns}:{sa}",
                             token=token, namespace=self.ns)
        else:
            # No credentials: anonymous, never the user's own kubeconfig.
            write_kubeconfig(kubeconfig, self.kubelet.server, ca, user="anonymous", namespace=self.ns)
        self.kubeconfig = kubeconfig
        return token

    def _get_cm(self, name: str, optional: bool) -> dict | None:
        try:
            return self.api.config_map(self.ns, name)
        except ApiError as exc:
            if exc.status == 404 and optional:
                return None
            raise PrepareError(f"configmap {self.ns}/{name}: {exc}") from None

    def _get_secret(self, name: str, optional: bool) -> dict | None:
        try:
            sec = self.api.secret(self.ns, name)
        except ApiError as exc:
            if exc.status == 404 and optional:
                return None
            raise PrepareError(f"secret {self.ns}/{name}: {exc}") from None
        sec["data"] = {k: base64.b64decode(v) for k, v in (sec.get("data") or {}).items()}
        return sec

    @staticmethod
    def _write_items(target: Path, data: dict[str, bytes], items, default_mode) -> None:
        if items:
            pairs = [(it["key"], it["path"], it.get("mode")) for it in items if it["key"] in data]
            missing = [it["key"] for it in items if it["key"] not in data]
            if missing:
                raise PrepareError(f"keys {missing} not found")
        else:
            pairs = [(k, k, None) for k in data]
        for key, rel, mode in pairs:
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[key])
            path.chmod(_mode(mode, default_mode))

    def _cm_bytes(self, cm: dict) -> dict[str, bytes]:
        data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return data

    def _write_volume(self, vol: dict, root: Path, token: str | None) -> Path:
        name = vol["name"]
        if "hostPath" in vol:
            return Path(vol["hostPath"]["path"])
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        if "configMap" in vol:
            src = vol["configMap"]
            cm = self._get_cm(src["name"], bool(src.get("optional")))
            if cm is not None:
                self._write_items(target, self._cm_bytes(cm), src.get("items"), src.get("defaultMode"))
        elif "secret" in vol:
            src = vol["secret"]
            sec = self._get_secret(src["secretName"], bool(src.get("optional")))
            if sec is not None:
                self._write_items(target, sec["data"], src.get("items"), src.get("defaultMode"))
        elif "downwardAPI" in vol:
            self._write_downward(target, vol["downwardAPI"].get("items") or [])
        elif "projected" in vol:
            default_mode = vol["projected"].get("defaultMode")
            for source in vol["projected"].get("sources") or []:
                if "configMap" in source:
                    src = source["configMap"]
                    cm = self._get_cm(src["name"], bool(src.get("optional")))
                    if cm is not None:
                        self._write_items(target, self._cm_bytes(cm), src.get("items"), default_mode)
                elif "secret" in source:
                    src = source["secret"]
                    sec = self._get_secret(src["name"], bool(src.get("optional")))
                    if sec is not None:
                        self._write_items(target, sec["data"], src.get("items"), default_mode)
                elif "downwardAPI" in source:
                    self._write_downward(target, source["downwardAPI"].get("items") or [])
                elif "serviceAccountToken" in source:
                    src = source["serviceAccountToken"]
                    sa = self.pod["spec"].get("serviceAccountName") or "default"
                    audience = src.get("audience")
                    try:
                        tok = self.api.token(self.ns, sa, self.name, self.uid,
                                             audiences=[audience] if audience else None)
                    except ApiError as exc:
                        raise PrepareError(f"projected token for {self.ns}/{sa}: {exc}") from None
                    path = target / src.get("path", "token")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(tok)
        # emptyDir, persistentVolumeClaim and anything else: an empty folder.
        return target

    def _write_downward(self, target: Path, items: list) -> None:
        for it in items:
            if "fieldRef" in it:
                value = field_value(self.pod, it["fieldRef"]["fieldPath"], self.ip or "")
            elif "resourceFieldRef" in it:
                ref = it["resourceFieldRef"]
                cont = next((c for c in self.pod["spec"]["containers"] if c["name"] == ref.get("containerName")),
                            self.pod["spec"]["containers"][0])
                value = resource_value(cont, ref)
            else:
                continue
            path = target / it["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)

    def _prepare_container(self, c: ContainerRun, volumes: dict[str, Path]) -> None:
        spec = c.spec
        # mountPath -> folder on this machine, longest first
        mounts: list[tuple[str, str]] = []
        for m in spec.get("volumeMounts") or []:
            base = volumes.get(m["name"])
            if base is None:
                raise PrepareError(f"volume {m['name']!r} not found")
            host = base / m["subPath"] if m.get("subPath") else base
            mounts.append((m["mountPath"].rstrip("/") or "/", str(host)))
        mounts.sort(key=lambda p: len(p[0]), reverse=True)

        def remap(value: str) -> str:
            for mount, host in mounts:
                if value == mount or value.startswith(mount + "/"):
                    return host + value[len(mount):]
                if "=" in value:  # --flag=/mount/path
                    head, _, rest = value.partition("=")
                    if rest == mount or rest.startswith(mount + "/"):
                        return f"{head}={host}{rest[len(mount):]}"
            return value

        env = self.kubelet.base_env()
        env["HOSTNAME"] = self.name
        env["POD_IP"] = self.ip or ""
        env["KUBECONFIG"] = str(self.kubeconfig)
        mapping: dict[str, str] = {"POD_IP": env["POD_IP"], "HOSTNAME": self.name}
        for src in spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                ref = src["configMapRef"]
                cm = self._get_cm(ref["name"], bool(ref.get("optional")))
                items = (cm or {}).get("data") or {}
            elif "secretRef" in src:
                ref = src["secretRef"]
                sec = self._get_secret(ref["name"], bool(ref.get("optional")))
                items = {k: v.decode(errors="replace") for k, v in ((sec or {}).get("data") or {}).items()}
            else:
                items = {}
            for k, v in items.items():
                mapping[prefix + k] = v
        for e in spec.get("env") or []:
            name = e["name"]
            if "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    value = field_value(self.pod, vf["fieldRef"]["fieldPath"], self.ip or "")
                elif "resourceFieldRef" in vf:
                    value = resource_value(spec, vf["resourceFieldRef"])
                elif "configMapKeyRef" in vf:
                    ref = vf["configMapKeyRef"]
                    cm = self._get_cm(ref["name"], bool(ref.get("optional")))
                    data = (cm or {}).get("data") or {}
                    if ref["key"] not in data:
                        if ref.get("optional"):
                            continue
                        raise PrepareError(f"key {ref['key']!r} not in configmap {self.ns}/{ref['name']}")
                    value = data[ref["key"]]
                elif "secretKeyRef" in vf:
                    ref = vf["secretKeyRef"]
                    sec = self._get_secret(ref["name"], bool(ref.get("optional")))
                    data = (sec or {}).get("data") or {}
                    if ref["key"] not in data:
                        if ref.get("optional"):
                            continue
                        raise PrepareError(f"key {ref['key']!r} not in secret {self.ns}/{ref['name']}")
                    value = data[ref["key"]].decode(errors="replace")
                else:
                    raise PrepareError(f"unsupported valueFrom in env {name!r}")
            else:
                value = expand(e.get("value", ""), mapping)
            mapping[name] = value
        for k, v in mapping.items():
            env[k] = remap(v)
        argv = [expand(a, mapping) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        if not spec.get("command"):
            raise PrepareError(
                f"container {c.name!r} has no command: the test kubelet runs commands locally and pulls no image"
            )
        c.argv = [remap(a) for a in argv]
        c.env = env
        wd = spec.get("workingDir")
        wd = remap(wd) if wd else None
        c.cwd = wd if wd and os.path.isdir(wd) else str(self.kubelet.workdir)
        (self.pod_dir / f"{c.name}.cmd.json").write_text(json.dumps(
            {"argv": c.argv, "cwd": c.cwd, "pod_ip": self.ip,
             "env": {k: v for k, v in env.items() if k in mapping or k in ("POD_IP", "KUBECONFIG", "PATH")}},
            indent=2))


# --------------------------------------------------------------------------- the kubelet


class Kubelet:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.api = Api(args.kubeconfig)
        self.node = args.node_name
        self.state_dir = Path(args.state_dir)
        (self.state_dir / "pods").mkdir(parents=True, exist_ok=True)
        self.workdir = Path(args.workdir)
        self.server = args.server
        self.ca_pem = Path(args.ca_file).read_bytes()
        self.ips = IPAllocator(args.pod_ip_prefix)
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self._proc_lock = threading.Lock()
        self.python_bin = os.path.dirname(sys.executable)

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k != "KUBECONFIG" and not k.startswith("KUBERNETES_") and not k.startswith("MODELPLEX_CLUSTER")}
        env["PATH"] = os.pathsep.join([self.python_bin, env.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    # -- node

    def node_status(self) -> dict:
        ts = now_rfc3339()
        conds = [
            ("Ready", "True", "KubeletReady", "modelplex test kubelet is posting ready status"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
            ("PIDPressure", "False", "KubeletHasSufficientPID", ""),
        ]
        return {
            "capacity": NODE_CAPACITY,
            "allocatable": NODE_CAPACITY,
            "conditions": [{"type": t, "status": s, "reason": r, "message": m,
                            "lastHeartbeatTime": ts, "lastTransitionTime": self._started}
                           for t, s, r, m in conds],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": int(self.args.serve_port or 10250)}},
            "nodeInfo": {
                "machineID": "modelplex", "systemUUID": "modelplex", "bootID": "modelplex",
                "kernelVersion": os.uname().release, "osImage": "modelplex test kubelet",
                "containerRuntimeVersion": "modelplex://local-processes",
                "kubeletVersion": "v1.33.13-modelplex", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        }

    def register_node(self) -> None:
        self._started = now_rfc3339()
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "labels": {
            "kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "modelplex.io/test-kubelet": "true"}}}
        try:
            self.api.create_node(body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self.api.patch_node_status(self.node, self.node_status())
        log.info("registered node %s", self.node)

    def heartbeat(self) -> None:
        while not self.stopping.wait(10):
            try:
                self.api.patch_node_status(self.node, self.node_status())
            except ApiError as exc:
                if exc.status == 404:
                    try:
                        self.register_node()
                    except ApiError:
                        pass
                log.warning("node heartbeat failed: %s", exc)
            except Exception as exc:  # noqa: BLE001
                log.warning("node heartbeat failed: %s", exc)

    # -- pods

    def sync(self, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        uid = meta.get("uid")
        if not uid:
            return
        node = spec.get("nodeName")
        if not node:
            if not meta.get("deletionTimestamp") and not spec.get("schedulingGates"):
                try:
                    self.api.bind(meta["namespace"], meta["name"], uid, self.node)
                    log.info("bound %s/%s to %s", meta["namespace"], meta["name"], self.node)
                except ApiError as exc:
                    if exc.status not in (404, 409):
                        log.warning("binding %s/%s failed: %s", meta["namespace"], meta["name"], exc)
            return
        if node != self.node:
            return
        with self.lock:
            if self.stopping.is_set():
                return
            worker = self.workers.get(uid)
            if worker is None:
                if meta.get("deletionTimestamp"):
                    # Never ran here (or the kubelet restarted): finish the deletion.
                    try:
                        self.api.delete_pod_now(meta["namespace"], meta["name"], uid)
                    except ApiError:
                        pass
                    return
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    return
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.start()
            else:
                worker.update(pod)

    def forget(self, uid: str) -> None:
        with self.lock:
            worker = self.workers.get(uid)
        if worker is not None:
            worker.mark_gone()

    def worker_done(self, worker: PodWorker) -> None:
        with self.lock:
            if self.workers.get(worker.uid) is worker:
                del self.workers[worker.uid]
        self.write_processes()

    def write_processes(self) -> None:
        with self.lock:
            workers = list(self.workers.values())
        items = []
        for w in workers:
            for c in w.all_runs():
                items.append({"namespace": w.ns, "pod": w.name, "container": c.name, "pid": c.pid,
                              "pod_ip": w.ip, "log": str(c.log_path), "phase": w._phase()})
        with self._proc_lock:
            path = self.state_dir / "processes.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(items, indent=2))
            tmp.replace(path)

    def resync(self) -> str:
        listing = self.api.list_pods()
        seen = set()
        for pod in listing.get("items") or []:
            seen.add(pod["metadata"]["uid"])
            self.sync(pod)
        with self.lock:
            missing = [uid for uid in self.workers if uid not in seen]
        for uid in missing:
            self.forget(uid)
        return listing["metadata"]["resourceVersion"]

    def resync_loop(self) -> None:
        while not self.stopping.wait(5):
            try:
                self.resync()
            except Exception as exc:  # noqa: BLE001
                log.warning("resync failed: %s", exc)

    def watch_loop(self) -> None:
        rv = self.resync()
        while not self.stopping.is_set():
            try:
                for etype, obj in self.api.watch_pods(rv):
                    if self.stopping.is_set():
                        return
                    meta = obj.get("metadata") or {}
                    if meta.get("resourceVersion"):
                        rv = meta["resourceVersion"]
                    if etype == "BOOKMARK":
                        continue
                    if etype == "ERROR":
                        raise ApiError(int(obj.get("code") or 0), obj.get("message", ""))
                    if etype == "DELETED":
                        self.forget(meta.get("uid", ""))
                    else:
                        self.sync(obj)
            except Exception as exc:  # noqa: BLE001
                if self.stopping.is_set():
                    return
                log.info("pod watch restarted (%s)", exc)
                time.sleep(0.5)
                try:
                    rv = self.resync()
                except Exception as exc2:  # noqa: BLE001
                    log.warning("resync failed: %s", exc2)
                    time.sleep(1)

    def find_worker(self, ns: str, name: str) -> PodWorker | None:
        with self.lock:
            for w in self.workers.values():
                if w.ns == ns and w.name == name:
                    return w
        return None

    def shutdown(self) -> None:
        """Stop every pod's processes (the pod objects stay)."""
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.wake.set()
        for w in workers:
            w.finished.wait(30)
        self.write_processes()

    def run(self) -> None:
        self.register_node()
        if self.args.serve_port:
            LogServer(self).start()
        threading.Thread(target=self.heartbeat, name="heartbeat", daemon=True).start()
        threading.Thread(target=self.resync_loop, name="resync", daemon=True).start()
        self.write_processes()
        self.watch_loop()


# --------------------------------------------------------------------------- kubectl logs


class LogServer(threading.Thread):
    """Serves /containerLogs/<ns>/<pod>/<container> to the apiserver (``kubectl logs``)."""

    def __init__(self, kubelet: Kubelet):
        super().__init__(name="log-server", daemon=True)
        self.kubelet = kubelet
        args = kubelet.args
        handler = self._handler()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", int(args.serve_port)), handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.serve_cert, args.serve_key)
        ctx.load_verify_locations(args.ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)

    def run(self) -> None:
        self.httpd.serve_forever(poll_interval=0.5)

    def _handler(self):
        kubelet = self.kubelet

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *a):
                log.debug("log server: " + fmt, *a)

            def _plain(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                parts = url.path.strip("/").split("/")
                if url.path in ("/healthz", "/readyz"):
                    return self._plain(200, "ok")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    return self._plain(404, f"{url.path}: not supported by the Modelplex test kubelet "
                                            "(only container logs; exec and port-forward are not)")
                _, ns, pod, container = parts
                worker = kubelet.find_worker(ns, pod)
                if worker is not None:
                    path = worker.pod_dir / f"{container}.log"
                else:
                    dirs = sorted((kubelet.state_dir / "pods").glob(f"{ns}_{pod}_*"),
                                  key=lambda p: p.stat().st_mtime, reverse=True)
                    path = dirs[0] / f"{container}.log" if dirs else None
                if path is None or not path.exists():
                    return self._plain(404, f"no log for {ns}/{pod}[{container}]")
                follow = query.get("follow", ["false"])[0] == "true"
                tail_lines = query.get("tailLines", [None])[0]
                limit = query.get("limitBytes", [None])[0]
                data = path.read_bytes()
                if tail_lines is not None:
                    lines = data.splitlines(keepends=True)
                    data = b"".join(lines[-int(tail_lines):]) if int(tail_lines) > 0 else b""
                if limit is not None:
                    data = data[: int(limit)]
                if not follow:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                pos = path.stat().st_size

                def chunk(b: bytes) -> None:
                    self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                    self.wfile.flush()

                try:
                    if data:
                        chunk(data)
                    while not kubelet.stopping.is_set():
                        size = path.stat().st_size
                        if size > pos:
                            with open(path, "rb") as f:
                                f.seek(pos)
                                new = f.read(size - pos)
                            pos = size
                            chunk(new)
                        elif kubelet.find_worker(ns, pod) is None:
                            break
                        else:
                            time.sleep(0.2)
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
                    pass

        return Handler


# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelplex_cluster.kubelet", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True, help="admin kubeconfig of the control plane")
    parser.add_argument("--state-dir", required=True, help="folder for pod folders, logs, processes.json")
    parser.add_argument("--node-name", default="modelplex-node")
    parser.add_argument("--workdir", default=os.getcwd(), help="working directory of pod processes")
    parser.add_argument("--pod-ip-prefix", default="127.0", help="pods get addresses 127.N.x.y from this /16")
    parser.add_argument("--server", required=True, help="apiserver URL written into pods' kubeconfigs")
    parser.add_argument("--ca-file", required=True, help="cluster CA (for pods' kubeconfigs and the log server)")
    parser.add_argument("--serve-port", type=int, default=0, help="port of the log server (kubectl logs)")
    parser.add_argument("--serve-cert")
    parser.add_argument("--serve-key")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    kubelet = Kubelet(args)

    def on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        kubelet.run()
    except SystemExit:
        pass
    finally:
        log.info("stopping: terminating pod processes")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kubelet.shutdown()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
