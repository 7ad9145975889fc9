"""``serve.run`` and ``serve.shutdown``: an application graph on this machine, as ``modelplex local`` runs it.

Each application (``serve.run(app, name=...)``, "default" by default, as in Ray) is one
``modelplex local`` on its deployments' MultiplexedDeployments (the ingress first): replicas and
cache-aware routers in processes of their own, exactly what a manifest gets, the routers on
consecutive free ports. The applications share one HTTP port (8000 by default as in Ray;
``$MODELPLEX_SERVE_HTTP_PORT`` moves it), where :mod:`~modelplex.serve.front` relays each request
to the ingress router of the application whose route prefix matches. ``serve.run`` returns once
every router has its replicas ready, and gives the ingress deployment's handle. Their output
comes through on stderr.
"""

from __future__ import annotations

import atexit
import collections
import io
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import yaml

from modelplex import processes
from modelplex.handles import DeploymentHandle, forget_routers, handle, router_moved
from modelplex.processes import consecutive_free_ports, port_free
from modelplex.serve import graph
from modelplex.serve.deployment import Application
from modelplex.serve.front import Front
from modelplex.serve.hosted import ENV_PAYLOAD, HANDLER
from modelplex.wire.credentials import (ENV_INTERNAL_TOKEN_FILE, TokenFile, internal_token_file, new_token,
                                        use_internal_token, write_token_file)
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX, NO_ROUTE, check_route_prefix
from modelplex.wire.names import dns_label, router_env_name
from modelplex.wire.ready import READY_FILE_OPTION, read_ready_file

log = logging.getLogger("modelplex.serve")

ENV_HTTP_PORT = "MODELPLEX_SERVE_HTTP_PORT"
DEFAULT_HTTP_PORT = 8000
#: Where the shared HTTP port and the applications' routers listen.
HTTP_HOST = "127.0.0.1"
#: Several torch imports at once on a small machine: generous.
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DeploymentStatusOverview:
    """A deployment of a running application, as Ray's ``serve.status()`` gives it."""

    status: str
    replica_states: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ApplicationStatusOverview:
    """A running application: its status, route prefix (None: no HTTP route) and deployments."""

    status: str
    route_prefix: str | None
    deployments: dict[str, DeploymentStatusOverview] = field(default_factory=dict)


@dataclass(frozen=True)
class ServeStatus:
    """What ``serve.status()`` returns: the applications by name."""

    applications: dict[str, ApplicationStatusOverview] = field(default_factory=dict)


class _Running:
    """One ``modelplex local`` process and what it serves."""

    def __init__(self, nodes: list[graph.Node], folder: Path, port: int):
        self.nodes = nodes
        self.folder = folder
        self.urls: dict[str, str] = {}
        self.tail: deque[str] = deque(maxlen=60)
        #: Where the run says its routers' URLs once they are ready (modelplex.wire.ready).
        self.ready_file = folder / "ready.json"
        # In a group of its own that gets SIGTERM should this process die: nothing outlives it.
        argv = [sys.executable, "-m", "modelplex_launcher.cli", "local", str(folder / "app.yaml"), "--port", str(port),
                READY_FILE_OPTION, str(self.ready_file)]
        env = {**os.environ, "PYTHONPATH": import_path(), ENV_INTERNAL_TOKEN_FILE: str(script_credential().path)}
        self.proc = processes.spawn(argv, pipe=True, env=env)
        self.echo = threading.Thread(target=self._echo, name="modelplex-serve-output", daemon=True)
        self.echo.start()

    def _echo(self) -> None:
        for raw in self.proc.stdout or ():  # (spawned with pipe=True: always set)
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            self.tail.append(line)

    def wait_ready(self, timeout_s: float) -> None:
        try:
            ready = processes.wait_for(lambda: read_ready_file(self.ready_file), timeout_s, interval=0.1,
                                       what="modelplex local", guard=self._alive)
        except processes.WaitTimeout:
            raise TimeoutError(f"serve.run: not ready after {timeout_s:g} s:\n" + "".join(self.tail)) from None
        assert ready is not None  # (wait_for returns only what is there)
        self.urls = ready.urls

    def _alive(self) -> None:
        if self.proc.poll() is not None:
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
#: The applications ``serve.run`` started, by name.
_apps: dict[str, _Application] = {}
#: The HTTP port they share (started with the first).
_front: Front | None = None


@dataclass
class _Application:
    """One application ``serve.run`` started: its ``modelplex local``, its route prefix (``none``:
    no HTTP route) and its first router port (an update keeps it, so its routers keep their URLs)."""

    name: str
    route_prefix: str
    running: _Running
    base_port: int

    @property
    def ingress(self) -> str:
        return self.running.nodes[0].name

    @property
    def urls(self) -> dict[str, str]:
        return self.running.urls


def run(target: Application, *, name: str = "default", route_prefix: str | None = "/", blocking: bool = False,
        _port: int | None = None) -> DeploymentHandle:
    """Run ``target``'s graph on this machine as the application ``name`` and return its ingress
    deployment's handle. As in Ray, an application of that name is updated (replaced; handles
    to it follow) and the others keep serving. Over HTTP the applications share one port (8000,
    ``$MODELPLEX_SERVE_HTTP_PORT``), each answering at its ``route_prefix`` and every path below
    it (None: no HTTP route, handles only); two applications cannot share a prefix."""
    prefix = check_route_prefix(route_prefix)
    if not isinstance(name, str) or not name:
        raise ValueError(f"serve.run: an application's name is a non-empty string (got {name!r})")
    nodes = graph.walk(target)
    ignored = graph.unsupported_ray_environment(os.environ)
    if ignored:
        log.warning("serve.run: %s %s no effect in Modelplex", ", ".join(ignored), "has" if len(ignored) == 1 else "have")
    with _lock:
        for other in _apps.values():
            if other.name != name and prefix != NO_ROUTE and other.route_prefix == prefix:
                raise ValueError(f'Prefix {prefix} is being used by application "{other.name}". '
                                 f'Failed to deploy application "{name}".')
        front = _open_front(_port)
        old = _apps.pop(name, None)
        if old is not None:
            _stop(old)
        # An update with the same deployments keeps their ports: handles made before it still reach
        # them. Other deployments get new ports, so no old handle reaches a deployment it did not name.
        previous = old.base_port if old is not None and [n.name for n in old.running.nodes] == [n.name for n in nodes] \
            else None
        base = _ports_for(len(nodes), previous, front.port)
        folder = Path(tempfile.mkdtemp(prefix=f"modelplex-serve-{dns_label(name)}-"))
        try:
            _write(nodes, folder, prefix)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            _routes_changed()
            raise
        running = _Running(nodes, folder, base)
        try:
            running.wait_ready(START_TIMEOUT_S)
        except BaseException:
            running.stop()
            _routes_changed()
            raise
        app = _apps[name] = _Application(name, prefix, running, base)
        for node in nodes:  # modelplex.handle finds them by name, Ray's spelling or the DNS label
            os.environ[router_env_name(node.name)] = running.urls[node.name]
            os.environ.setdefault(router_env_name(node.options.name), running.urls[node.name])
            if old is not None and node.name in old.urls:
                router_moved(old.urls[node.name], running.urls[node.name])
        _routes_changed()
    ingress = handle(app.ingress, url=running.urls[app.ingress])
    if blocking:
        try:
            running.proc.wait()
        except KeyboardInterrupt:
            shutdown()
    return ingress


def _open_front(port: int | None) -> Front:
    global _front
    wanted = port or int(os.environ.get(ENV_HTTP_PORT, DEFAULT_HTTP_PORT))
    if _front is not None and _front.port != wanted:
        if _apps:
            raise ValueError(f"serve.run: the applications share HTTP port {_front.port}; "
                             f"delete them (serve.shutdown()) before moving it to {wanted}")
        _front.stop()
        _front = None
    if _front is None:
        front = Front(HTTP_HOST, wanted)
        front.start()
        _front = front
    return _front


def _ports_for(count: int, previous: int | None, http_port: int) -> int:
    """The first of ``count`` consecutive free ports for an application's routers: its previous
    ones when they are free again (its routers keep their URLs), else new ones."""
    if previous is not None and all(port_free(HTTP_HOST, port) for port in range(previous, previous + count)):
        return previous
    while True:
        base = consecutive_free_ports(count, HTTP_HOST)
        if not base <= http_port < base + count:
            return base


def _routes_changed() -> None:
    """Tell the front which router answers under which prefix; a front without applications closes."""
    global _front
    if _front is None:
        return
    if not _apps:
        _front.stop()
        _front = None
        return
    _front.set_routes({app.route_prefix: app.urls[app.ingress] for app in _apps.values()
                       if app.route_prefix != NO_ROUTE})


def _stop(app: _Application) -> None:
    app.running.stop()
    forget_routers(list(app.urls.values()))


def delete(name: str, _blocking: bool = True) -> None:
    """Stop the application ``name`` (as Ray's ``serve.delete``); the others keep serving. An
    unknown name is no error."""
    with _lock:
        app = _apps.pop(name, None)
        if app is not None:
            _stop(app)
        _routes_changed()


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
        documents.append(graph.manifest(node, image="local", handler=HANDLER, env=env, environ=os.environ, app=nodes))
    (folder / "app.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False))


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """The handle of a deployment that ``serve.run`` started (Ray's class name or its DNS label),
    in the application ``app_name`` (by default the only one running, else the last one started)."""
    label = dns_label(deployment_name)
    with _lock:
        if app_name is not None and app_name not in _apps and _apps:
            raise KeyError(f"no application {app_name!r}; running: {', '.join(_apps)}")
        app = _apps.get(app_name) if app_name is not None else (list(_apps.values())[-1] if _apps else None)
    if app is not None and label in app.urls:
        return handle(label, url=app.urls[label])
    if app is not None and app_name is not None:
        raise KeyError(f"application {app_name!r} has no deployment {deployment_name!r}; it has "
                       f"{', '.join(app.urls)}")
    return handle(label)


def status() -> ServeStatus:
    """The applications ``serve.run`` started and their deployments, as Ray's ``serve.status()``."""
    with _lock:
        return ServeStatus(applications={
            app.name: ApplicationStatusOverview(
                status="RUNNING" if app.running.proc.poll() is None else "UNHEALTHY",
                route_prefix=None if app.route_prefix == NO_ROUTE else app.route_prefix,
                deployments={node.name: DeploymentStatusOverview(
                    status="HEALTHY" if app.running.proc.poll() is None else "UNHEALTHY",
                    replica_states={"RUNNING": node.options.replicas()})
                    for node in app.running.nodes})
            for app in _apps.values()})


def shutdown() -> None:
    """Stop every application ``serve.run`` started, and their HTTP port (also at interpreter exit)."""
    with _lock:
        while _apps:
            _stop(_apps.pop(next(iter(_apps))))
        _routes_changed()


atexit.register(shutdown)
