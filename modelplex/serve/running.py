"""``serve.run`` and ``serve.shutdown``: an application graph on this machine, as ``modelplex local`` runs it.

``serve.run`` writes one MultiplexedDeployment per deployment (the ingress first, so its router
takes the HTTP port, 8000 by default as in Ray; ``$MODELPLEX_SERVE_HTTP_PORT`` moves it) and
starts ``modelplex local`` on them: replicas and cache-aware routers in processes of their own,
exactly what a manifest gets. It returns once every router has its replicas ready, and gives
the ingress deployment's handle. Their output comes through on stderr.
"""

from __future__ import annotations

import atexit
import collections
import io
import os
import re
import shutil
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

import cloudpickle
import yaml

from modelplex import processes
from modelplex.wire.credentials import (ENV_INTERNAL_TOKEN_FILE, TokenFile, internal_token_file, new_token,
                                        use_internal_token, write_token_file)
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX, check_route_prefix
from modelplex.handles import DeploymentHandle, handle
from modelplex.wire.names import dns_label, router_env_name
from modelplex.serve import graph
from modelplex.serve.deployment import Application
from modelplex.serve.hosted import ENV_PAYLOAD, HANDLER

ENV_HTTP_PORT = "MODELPLEX_SERVE_HTTP_PORT"
DEFAULT_HTTP_PORT = 8000
#: Several torch imports at once on a small machine: generous.
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
_READY = re.compile(r"^(\S+) is ready at (http://\S+)")


class _Running:
    """One ``modelplex local`` process and what it serves."""

    def __init__(self, nodes: list[graph.Node], folder: Path, port: int):
        self.nodes = nodes
        self.folder = folder
        self.urls: dict[str, str] = {}
        self.tail: deque[str] = deque(maxlen=60)
        self.ready = threading.Event()
        # In a group of its own that gets SIGTERM should this process die: nothing outlives it.
        argv = [sys.executable, "-m", "modelplex_launcher.cli", "local", str(folder / "app.yaml"), "--port", str(port)]
        env = {**os.environ, "PYTHONPATH": import_path(), ENV_INTERNAL_TOKEN_FILE: str(script_credential().path)}
        self.proc = processes.spawn(argv, pipe=True, env=env)
        self.echo = threading.Thread(target=self._echo, name="modelplex-serve-output", daemon=True)
        self.echo.start()

    def _echo(self) -> None:
        for raw in self.proc.stdout or ():  # (spawned with pipe=True: always set)
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            self.tail.append(line)
            if match := _READY.match(line):
                self.urls[match[1]] = match[2]
            if line.startswith("Press Ctrl-C"):
                self.ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        try:
            processes.wait_for(self.ready.is_set, timeout_s, interval=0.1, what="modelplex local", guard=self._alive)
        except processes.WaitTimeout:
            raise TimeoutError(f"serve.run: not ready after {timeout_s:g} s:\n" + "".join(self.tail)) from None

    def _alive(self) -> None:
        if self.proc.poll() is not None and not self.ready.is_set():
            self.echo.join(5)
            raise RuntimeError(f"serve.run: modelplex local exited with code {self.proc.returncode}:\n"
                               + "".join(self.tail))

    def stop(self) -> None:
        # SIGTERM: local stops the routers, then the replicas, each within its grace.
        processes.stop(self.proc, grace=STOP_TIMEOUT_S)
        self.echo.join(5)
        for node in self.nodes:
            for name in (node.name, node.options.name):
                if os.environ.get(router_env_name(name)) == self.urls.get(node.name):
                    os.environ.pop(router_env_name(name), None)
        shutil.rmtree(self.folder, ignore_errors=True)


def script_credential() -> TokenFile:
    """This script's internal credential, for its handles and every run it starts: one for the
    script's life, so a handle made for one run still works after a re-run."""
    current = internal_token_file()
    if current is not None and current.token() is not None:
        return current
    folder = Path(tempfile.mkdtemp(prefix="modelplex-serve-credential-"))
    atexit.register(shutil.rmtree, folder, True)
    path = write_token_file(folder / "internal-token", new_token())
    use_internal_token(path)
    return TokenFile(path)


def import_path() -> str:
    """This process's import path for the replicas, as ``PYTHONPATH``: what a deployment's code
    imports by reference (a helper module beside the script) imports there too. The
    interpreter's own folders are on their path already."""
    prefixes = tuple(os.path.join(os.path.realpath(p), "") for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    entries = [os.path.realpath(entry or os.curdir) for entry in sys.path]
    entries = [entry for entry in entries if not os.path.join(entry, "").startswith(prefixes)]
    if os.environ.get("PYTHONPATH"):
        entries.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(dict.fromkeys(entries))


_lock = threading.Lock()
_running: _Running | None = None


def run(target: Application, *, name: str = "default", route_prefix: str | None = "/", blocking: bool = False,
        _port: int | None = None) -> DeploymentHandle:
    """Run ``target``'s graph on this machine (replacing the one running) and return the ingress
    deployment's handle. Over HTTP the ingress answers on its router's port, at ``route_prefix``
    and every path below it (None: no HTTP route, handles only)."""
    global _running
    prefix = check_route_prefix(route_prefix)
    nodes = graph.walk(target)
    port = _port or int(os.environ.get(ENV_HTTP_PORT, DEFAULT_HTTP_PORT))
    with _lock:
        _shutdown_locked()
        folder = Path(tempfile.mkdtemp(prefix=f"modelplex-serve-{name}-"))
        try:
            _write(nodes, folder, prefix)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        running = _Running(nodes, folder, port)
        try:
            running.wait_ready(START_TIMEOUT_S)
        except BaseException:
            running.stop()
            raise
        _running = running
        for node in nodes:  # modelplex.handle finds them by name, Ray's spelling or the DNS label
            os.environ[router_env_name(node.name)] = running.urls[node.name]
            os.environ.setdefault(router_env_name(node.options.name), running.urls[node.name])
    ingress = handle(nodes[0].name, url=running.urls[nodes[0].name])
    if blocking:
        try:
            running.proc.wait()
        except KeyboardInterrupt:
            shutdown()
    return ingress


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle, and what a live app holds that pickle refuses: its locks are shipped new
    (nothing holds them while it is pickled), Starlette's ``State`` (a FastAPI app's) as its dict."""

    dispatch_table = collections.ChainMap({
        type(threading.Lock()): lambda lock: (threading.Lock, ()),
        type(threading.RLock()): lambda lock: (threading.RLock, ()),
    }, cloudpickle.CloudPickler.dispatch_table)

    def reducer_override(self, obj):
        starlette = sys.modules.get("starlette.datastructures")
        if starlette is not None and type(obj) is starlette.State:
            return starlette.State, (dict(obj._state),)
        return super().reducer_override(obj)


def _dumps(value: object) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer).dump(value)
    return buffer.getvalue()


def _write(nodes: list[graph.Node], folder: Path, route_prefix: str = "/") -> None:
    """Each deployment's pickle and the manifests that name them (``app.yaml``); the ingress
    (the first) answers HTTP at ``route_prefix``."""
    documents = []
    for node in nodes:
        payload = folder / f"{node.name}.pkl"
        payload.write_bytes(_dumps((node.target, node.args, node.kwargs, node.options.user_config)))
        env = {ENV_PAYLOAD: str(payload)}
        if node is nodes[0] and route_prefix != "/":
            env[ENV_ROUTE_PREFIX] = route_prefix
        documents.append(graph.manifest(node, image="local", handler=HANDLER, env=env))
    (folder / "app.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False))


def get_deployment_handle(deployment_name: str, app_name: str = "default") -> DeploymentHandle:
    """The handle of a deployment that ``serve.run`` started (Ray's class name or its DNS label)."""
    return handle(dns_label(deployment_name))


def _shutdown_locked() -> None:
    global _running
    if _running is not None:
        running, _running = _running, None
        running.stop()


def shutdown() -> None:
    """Stop what ``serve.run`` started (also at interpreter exit)."""
    with _lock:
        _shutdown_locked()


atexit.register(shutdown)
