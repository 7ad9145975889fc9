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
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import urllib.request
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import cloudpickle
import yaml

from modelplex import processes
from modelplex.handles import DeploymentHandle, forget_routers, handle, router_moved
from modelplex.processes import consecutive_free_ports, port_free
from modelplex.serve import graph
from modelplex.serve.config import HTTPOptions, LoggingConfig
from modelplex.serve.deployment import Application
from modelplex.serve.front import Front
from modelplex.serve.hosted import APPLIED_SUFFIX, ENV_PAYLOAD, HANDLER
from modelplex.wire.credentials import (ENV_INTERNAL_TOKEN_FILE, INTERNAL_TOKEN_HEADER, TokenFile, internal_token_file,
                                        new_token, use_internal_token, write_token_file)
from modelplex.wire.errors import RayServeException
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
#: How long serve.status() waits for a router's table.
STATUS_TIMEOUT_S = 5.0
#: How long serve.run waits for live replicas to reconfigure with a new user_config.
RECONFIGURE_TIMEOUT_S = 120.0


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
        logging_config: LoggingConfig | dict[str, Any] | None = None, _port: int | None = None) -> DeploymentHandle:
    """Run ``target``'s graph on this machine as the application ``name`` and return its ingress
    deployment's handle. As in Ray, an application of that name is updated (replaced; handles
    to it follow) and the others keep serving. Over HTTP the applications share one port (8000,
    ``$MODELPLEX_SERVE_HTTP_PORT``), each answering at its ``route_prefix`` and every path below
    it (None: no HTTP route, handles only); two applications cannot share a prefix.
    ``logging_config`` applies to each deployment that has none of its own, as in Ray."""
    prefix = check_route_prefix(route_prefix)
    if not isinstance(name, str) or not name:
        raise ValueError(f"serve.run: an application's name is a non-empty string (got {name!r})")
    nodes = graph.walk(target)
    if logging_config is not None:
        app_logging = LoggingConfig.of(logging_config)
        for node in nodes:
            if node.options.logging_config is None:
                node.options = replace(node.options, logging_config=app_logging)
    ignored = graph.unsupported_ray_environment(os.environ)
    if ignored:
        log.warning("serve.run: %s %s no effect in Modelplex", ", ".join(ignored), "has" if len(ignored) == 1 else "have")
    with _lock:
        for other in _apps.values():
            if other.name != name and prefix != NO_ROUTE and other.route_prefix == prefix:
                raise ValueError(f'Prefix {prefix} is being used by application "{other.name}". '
                                 f'Failed to deploy application "{name}".')
        front = _open_front(_port)
        current = _apps.get(name)
        changed = _user_config_only(current.running.nodes, nodes) if current and current.route_prefix == prefix else None
        if current is not None and changed:
            _reconfigure(current, changed)  # Ray's reconfigure on the live replicas: no restart
            return handle(current.ingress, url=current.urls[current.ingress])
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
            _write(nodes, folder, prefix, name)
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


#: ``serve.start(http_options=...)``: where the shared HTTP port listens (None: not called).
_http_options: HTTPOptions | None = None


def start(proxy_location: Any = None, http_options: HTTPOptions | dict[str, Any] | None = None,
          grpc_options: Any = None, **kwargs: Any) -> None:
    """Ray's ``serve.start``: where the applications ``serve.run`` starts answer HTTP
    (``http_options``: an :class:`~modelplex.serve.config.HTTPOptions` or a dict of its fields;
    ``host`` and ``port``). Call it before the first ``serve.run``, as in Ray. Ray's proxy
    placement and gRPC options have no equivalent here (each deployment's router serves gRPC
    by ``spec.router``): refused by name."""
    refused = sorted([name for name, value in (("proxy_location", proxy_location), ("grpc_options", grpc_options))
                      if value is not None] + list(kwargs))
    if refused:
        raise TypeError(f"serve.start: {', '.join(refused)} not supported by Modelplex (it takes http_options)")
    options = HTTPOptions.of(http_options)
    global _http_options
    with _lock:
        if _front is not None and _apps and (_front.port, _front.host) != (options.port, options.host):
            raise RayServeException(f"serve.start: the applications already answer at {_front.host}:{_front.port}; "
                                    "serve.shutdown() before moving them")
        _http_options = options


def _open_front(port: int | None) -> Front:
    global _front
    options = _http_options
    wanted = port or (options.port if options is not None else int(os.environ.get(ENV_HTTP_PORT, DEFAULT_HTTP_PORT)))
    host = options.host if options is not None else HTTP_HOST
    if _front is not None and (_front.port, _front.host) != (wanted, host):
        if _apps:
            raise ValueError(f"serve.run: the applications share HTTP port {_front.port}; "
                             f"delete them (serve.shutdown()) before moving it to {wanted}")
        _front.stop()
        _front = None
    if _front is None:
        front = Front(host, wanted)
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


def _payload(node: graph.Node) -> bytes:
    """What a replica of ``node`` builds its deployment from (:class:`~modelplex.serve.hosted.Hosted`)."""
    return _dumps((node.target, node.args, node.kwargs, node.options.user_config))


def _user_config_only(before: list[graph.Node], after: list[graph.Node]) -> list[graph.Node] | None:
    """The nodes of ``after`` whose ``user_config`` alone changed, where nothing else of the graph
    did (same deployments, code, arguments and other options) and each has a ``reconfigure``;
    else None (the application is replaced)."""
    if [node.name for node in before] != [node.name for node in after]:
        return None
    changed = []
    for old, new in zip(before, after):
        if replace(old.options, user_config=None) != replace(new.options, user_config=None) or \
                _dumps((old.target, old.args, old.kwargs)) != _dumps((new.target, new.args, new.kwargs)):
            return None
        if old.options.user_config != new.options.user_config:
            if new.options.user_config is None or not callable(getattr(new.target, "reconfigure", None)):
                return None
            changed.append(new)
    return changed or None


def _reconfigure(app: _Application, changed: list[graph.Node]) -> None:
    """Give ``changed``'s new ``user_config`` to their live replicas: each payload is replaced
    (a replica started later builds with it), each live replica calls ``reconfigure`` with it
    (:func:`~modelplex.serve.hosted.follow_user_config`) and says so; returns once all have."""
    for node in changed:
        path = app.running.folder / f"{node.name}.pkl"
        staged = path.with_suffix(".new")
        staged.write_bytes(_payload(node))
        os.replace(staged, path)
        stamp = str(path.stat().st_mtime_ns)
        live = (_live_replicas(app.urls.get(node.name)) or {}).get("RUNNING", 0)

        def applied() -> bool:
            return sum(1 for done in app.running.folder.glob(f"{path.name}{APPLIED_SUFFIX}*")
                       if done.read_text() == stamp) >= live

        try:
            processes.wait_for(applied, RECONFIGURE_TIMEOUT_S, interval=0.05, what=f"{node.options.name}.reconfigure")
        except processes.WaitTimeout:
            raise TimeoutError(f"serve.run: {node.options.name}'s replicas did not reconfigure within "
                               f"{RECONFIGURE_TIMEOUT_S:g} s:\n" + "".join(app.running.tail)) from None
        index = [n.name for n in app.running.nodes].index(node.name)
        app.running.nodes[index] = node
        log.info("serve.run: %s reconfigured in place (%d replica(s))", node.options.name, live)


def _write(nodes: list[graph.Node], folder: Path, route_prefix: str = "/", name: str = "default") -> None:
    """Each deployment's pickle and the manifests that name them (``app.yaml``); the ingress
    (the first) answers HTTP at ``route_prefix``."""
    documents = []
    for node in nodes:
        payload = folder / f"{node.name}.pkl"
        payload.write_bytes(_payload(node))
        env = {ENV_PAYLOAD: str(payload)}
        if node is nodes[0] and route_prefix != "/":
            env[ENV_ROUTE_PREFIX] = route_prefix
        documents.append(graph.manifest(node, image="local", handler=HANDLER, env=env, environ=os.environ, app=nodes,
                                        application=name))
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


def get_app_handle(name: str) -> DeploymentHandle:
    """The handle of the ingress deployment of the application ``name`` that ``serve.run``
    started, as Ray's ``serve.get_app_handle``; Ray's error for one that does not exist."""
    with _lock:
        app = _apps.get(name)
    if app is None:
        raise RayServeException(f"Application '{name}' does not exist.")
    return handle(app.ingress, url=app.urls[app.ingress])


def status() -> ServeStatus:
    """The applications ``serve.run`` started and their deployments, as Ray's ``serve.status()``:
    deployments by Ray's names (a second binding of one is ``Name_1``, as Ray names it), each
    with its replicas as its router sees them now (``RUNNING``: the ready ones; an autoscaled
    deployment at zero has none)."""
    with _lock:
        apps = list(_apps.values())
    applications = {}
    for app in apps:
        alive = app.running.proc.poll() is None
        deployments = {}
        for name, node in ray_names(app.running.nodes).items():
            states = _live_replicas(app.urls.get(node.name)) if alive else None
            deployments[name] = DeploymentStatusOverview(status=_deployment_status(states), replica_states=states or {})
        healthy = alive and all(d.status == "HEALTHY" for d in deployments.values())
        applications[app.name] = ApplicationStatusOverview(
            status="RUNNING" if healthy else "DEPLOYING" if alive else "UNHEALTHY",
            route_prefix=None if app.route_prefix == NO_ROUTE else app.route_prefix, deployments=deployments)
    return ServeStatus(applications=applications)


def ray_names(nodes: list[graph.Node]) -> dict[str, graph.Node]:
    """The nodes by Ray's deployment names: the class's (or ``name=``'s); a second binding of the
    same deployment ``Name_1``, as Ray suffixes it."""
    named: dict[str, graph.Node] = {}
    for node in nodes:
        name, suffix = node.options.name, 0
        while name in named:
            suffix += 1
            name = f"{node.options.name}_{suffix}"
        named[name] = node
    return named


def _live_replicas(router_url: str | None) -> dict[str, int] | None:
    """Replicas by Ray's states, from the router's table (None: the router did not answer)."""
    if router_url is None:
        return None
    token = script_credential().token() or ""
    request = urllib.request.Request(router_url + "/v1/replicas", headers={INTERNAL_TOKEN_HEADER: token})
    try:
        with urllib.request.urlopen(request, timeout=STATUS_TIMEOUT_S) as answer:  # noqa: S310 - loopback
            replicas = json.load(answer).get("replicas", [])
    except (OSError, ValueError):
        return None
    # Only ready ones: the router also lists the slots of an autoscaled deployment that no
    # process fills now (refused), which are no replicas at all.
    ready = sum(1 for replica in replicas if replica.get("ready"))
    return {"RUNNING": ready} if ready else {}


def _deployment_status(states: dict[str, int] | None) -> str:
    return "UNHEALTHY" if states is None else "HEALTHY"


def shutdown() -> None:
    """Stop every application ``serve.run`` started, and their HTTP port (also at interpreter exit)."""
    with _lock:
        while _apps:
            _stop(_apps.pop(next(iter(_apps))))
        _routes_changed()


atexit.register(shutdown)
