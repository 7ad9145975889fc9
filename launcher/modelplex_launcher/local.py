"""``modelplex local``: whole deployments on this machine, from the same manifests as a cluster.

For each MultiplexedDeployment (several manifests, or multi-document YAML) this starts
``spec.replicas`` replica processes on 127.0.0.1 (free ports) and one router process, the
first deployment's router on ``--port`` and the next ones on the ports after it. Every child
gets ``MODELPLEX_ROUTER_<NAME>=http://host:port`` for every deployment, so handles between
deployments resolve by name as they would in a cluster.

Children run in process groups of their own (a Ctrl-C in the terminal reaches only this
supervisor, which then stops them in order) and get SIGTERM should the supervisor die
(``PR_SET_PDEATHSIG``), so nothing is left behind. A child that exits is restarted with a
growing delay, as a Kubernetes Deployment would, and the delay starts over once a child has
run for a while. Stopping gives routers, then replicas, ``spec.gracefulShutdownTimeoutSeconds``
to finish what they serve, as a pod's termination grace would.

A deployment with ``spec.autoscaling`` gets a port for each of its ``maxReplicas`` replicas
(its router polls them all; those not running are out of rotation) and starts
``initialReplicas`` (else ``minReplicas``) of them. Every second the supervisor reads the
router's load report (``GET /v1/load``), asks its :class:`~modelplex.autoscaling.Autoscaler`,
and starts replicas (after writing the hottest models to the file the new replicas pre-load)
or stops them, the coldest cache first, as the operator does with pods. At ``minReplicas: 0``
the router runs alone while idle and holds the first request until a replica is ready.
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
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from modelplex.autoscaling import (DEFAULT_TICK_S, ENV_PRELOAD_FILE, LOAD_PATH, Autoscaler, LoadReport, coldest_first,
                                   format_hot_models, hottest_models)
from modelplex.wire.names import MODEL_ID_HEADER, ROUTER_PORT, router_env_name
from modelplex.processes import free_ports, port_free, signal_group, spawn
from modelplex.wire.credentials import (ENV_CLIENT_TOKENS_DIR, ENV_INTERNAL_TOKEN_FILE, INTERNAL_TOKEN_HEADER,
                                        TokenFile, new_token, write_token_file)
from modelplex.wire.spec import (DEFAULT_GRACEFUL_SHUTDOWN_S, DEFAULT_MAX_MODELS_PER_REPLICA, Deployment, SecretDocument,
                                 SpecError, load_manifest_documents)

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

    @property
    def router_url(self) -> str:
        return f"http://{_connect_host(self.router_host)}:{self.router_port}"

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
    for index, (deployment, manifest) in enumerate(found):
        router_port = port + index
        if not port_free(host, router_port):
            raise SpecError([f"port {router_port} on {host} is in use (router of {deployment.name!r}); "
                             "pass --port to pick another"])
        spec = deployment.spec
        slots = spec.autoscaling.max_replicas if spec.autoscaling else spec.starting_replicas
        plans.append(Plan(deployment, manifest, host, router_port, free_ports(slots),
                          client_tokens=_client_tokens(deployment, secrets)))
    return plans


def _client_tokens(deployment: Deployment, secrets: dict[tuple[str, str], SecretDocument]) -> dict[str, str] | None:
    """The router's client tokens: the Secret ``spec.router.auth.secretRef`` names, from the manifests."""
    auth = deployment.spec.router.auth
    if auth is None:
        return None
    secret = secrets.get((deployment.namespace, auth.secret_ref.name))
    if secret is None:
        raise SpecError([f"deployment {deployment.name!r}: spec.router.auth.secretRef: no Secret "
                         f"{auth.secret_ref.name!r} in namespace {deployment.namespace!r} among the manifests "
                         "(add a kind: Secret document beside the deployment)"])
    return dict(secret.data)


def _connect_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class LocalRun:
    """Starts, watches and stops the children of a set of :class:`Plan` s."""

    def __init__(self, plans: list[Plan], *, out=None, log_level: str | None = None):
        self.plans = plans
        self.out = out or sys.stdout
        self.stop = threading.Event()
        self.log_level = log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        self.env = dict(os.environ)
        self.env["PYTHONUNBUFFERED"] = "1"
        for p in plans:
            self.env[router_env_name(p.deployment.name)] = p.router_url
        self.replicas: list[Child] = []
        self.routers: list[Child] = []
        self.scalers: list[Scaler] = []
        #: Local mode's own files (the hot-models lists, credentials), removed at shutdown.
        self.state_dir = Path(tempfile.mkdtemp(prefix="modelplex-local-"))
        self.internal_token = _internal_token_file(self.env, self.state_dir)
        self.env[ENV_INTERNAL_TOKEN_FILE] = str(self.internal_token.path)
        for p in plans:
            name = p.deployment.name
            base = [sys.executable, "-m", "modelplex_launcher.cli", "--log-level", self.log_level]
            replica_env = {**self.env, **_spec_env(p.deployment, self.say)}
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
                           "--host", p.router_host, "--port", str(p.router_port)]
            for i in range(len(p.replica_ports)):
                router_argv += ["--replica", f"{p.replica_name(i)}={p.replica_url(i)}"]
            # Ready once it has the replicas started with it; at zero, once it serves.
            starting = p.starting_replicas
            router_env = None
            if p.client_tokens is not None:
                router_env = {**self.env, ENV_CLIENT_TOKENS_DIR: str(self._write_client_tokens(name, p.client_tokens))}
            self.routers.append(Child(name=f"{name} router", argv=router_argv,
                                      ready_url=p.router_url + ("/readyz" if starting else "/healthz"),
                                      expected_replicas=starting or None, stop_grace_s=grace, env=router_env))

    def _write_client_tokens(self, deployment: str, tokens: dict[str, str]) -> Path:
        """The client tokens as a Secret volume lays them out: a folder, a file per client."""
        folder = self.state_dir / f"{deployment}.clients"
        for client, token in tokens.items():
            write_token_file(folder / client, token)
        return folder

    @property
    def children(self) -> list[Child]:
        return self.replicas + self.routers

    def say(self, message: str) -> None:
        print(message, file=self.out, flush=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        """Start everything, wait until ready, serve until SIGINT/SIGTERM; the exit code."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for p in self.plans:
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

    def _print_ready(self) -> None:
        self.say("")
        self.say(f"internal credential: {self.internal_token.path}  (set {ENV_INTERNAL_TOKEN_FILE} to it in scripts "
                 "that use handles)")
        for p in self.plans:
            if not p.replica_ports:
                continue
            spec = p.deployment.spec
            self.say(f"{p.deployment.name} is ready at {p.router_url}  ({router_env_name(p.deployment.name)})")
            if p.deployment.spec.autoscaling is not None and not p.starting_replicas:
                self.say("  (scaled to zero: the first request starts a replica and waits for it)")
            model = f" -H '{MODEL_ID_HEADER}: {spec.multiplexing.prewarm[0]}'" if spec.multiplexing.prewarm else ""
            body = p.deployment.example_request or "<request body>"
            if p.client_tokens is not None:
                model += " -H \"Authorization: Bearer $TOKEN\""  # a client's token: never printed
            self.say(f"  curl -s --json '{body}'{model} {p.router_url}/")
            if p.client_tokens is None:
                self.say(f"  curl -s {p.router_url}/v1/replicas")
        self.say("Press Ctrl-C to stop.")

    def _supervise(self) -> None:
        while not self.stop.wait(0.2):
            now = time.monotonic()
            for scaler in self.scalers:
                if now >= scaler.next_tick:
                    scaler.next_tick = now + DEFAULT_TICK_S
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
        """One round: the router's report, the decision, and replicas started or stopped."""
        name = scaler.plan.deployment.name
        report = self._read_load(scaler.plan)
        if report is None:
            if not scaler.unreadable:
                self.say(f"modelplex local: {name}: cannot read the router's load report; not scaling")
            scaler.unreadable = True
            return
        scaler.unreadable = False
        scaler.autoscaler.observe_report(report)
        current = scaler.current
        decision = scaler.autoscaler.decide(current)
        if decision.desired > current:
            free = [c for c in scaler.slots if not c.wanted and not c.running]
            starting = free[:decision.desired - current]
            if not starting:
                return  # every other slot is still stopping: next round
            self._write_hot_models(scaler, report)
            self.say(f"modelplex local: {name}: {current} -> {current + len(starting)} replica(s) "
                     f"({decision.reason}): starting {', '.join(c.name for c in starting)}")
            for child in starting:
                child.wanted = True
                child.restarts = 0
                self._start(child)
        elif decision.desired < current:
            running = [c.name for c in scaler.slots if c.wanted]
            leaving = set(coldest_first(report, running)[:current - decision.desired])
            self.say(f"modelplex local: {name}: {current} -> {decision.desired} replica(s) ({decision.reason}): "
                     f"stopping {', '.join(sorted(leaving))} (coldest cache first)")
            now = time.monotonic()
            for child in scaler.slots:
                if child.name in leaving:
                    child.wanted = False
                    child.ready = False
                    child.restart_at = None
                    if child.running:
                        child.signal_group(signal.SIGTERM)  # it drains, as a pod would
                        child.kill_at = now + child.stop_grace_s

    def _read_load(self, plan: Plan) -> LoadReport | None:
        try:
            request = urllib.request.Request(plan.router_url + LOAD_PATH,
                                             headers={INTERNAL_TOKEN_HEADER: self.internal_token.token() or ""})
            with urllib.request.urlopen(request, timeout=1.0) as response:
                return LoadReport.from_json(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def _write_hot_models(self, scaler: Scaler, report: LoadReport) -> None:
        """The models a new replica pre-loads: the hottest ones, as many as a replica holds."""
        capacity = max((r.capacity for r in report.replicas), default=0) or (
            scaler.plan.deployment.spec.multiplexing.max_models_per_replica or DEFAULT_MAX_MODELS_PER_REPLICA)
        text = format_hot_models(hottest_models(report, limit=capacity))
        partial = scaler.hot_models_file.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(scaler.hot_models_file)  # a replica starting now reads all of it or none

    def shutdown(self) -> None:
        """Stop the routers, then the replicas: SIGTERM each process group, wait for it within its
        grace, SIGKILL what is left. Idempotent."""
        # Routers first: they finish relaying what they took in while every replica still serves.
        for group in (self.routers, self.replicas):
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
        shutil.rmtree(self.state_dir, ignore_errors=True)


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


def run_local(manifest_paths: list[str], *, host: str = "127.0.0.1", port: int = ROUTER_PORT) -> int:
    """Run the deployments of ``manifest_paths`` here until Ctrl-C / SIGTERM; the exit code."""
    try:
        plans = plan(list(manifest_paths), host=host, port=port)
    except SpecError as error:
        print(f"modelplex local: {error}", file=sys.stderr)
        return 2
    return LocalRun(plans).run()
