"""Real replicas and routers as processes on loopback, started and always stopped by fixtures."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest

HERE = Path(__file__).resolve().parent
MODELPLEX = [sys.executable, "-m", "modelplex.cli"]
START_TIMEOUT_S = 90.0  # two cores, cold imports: generous


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_manifest(folder: Path, *, name: str = "plex", handler: str = "handlers:Echo", replicas: int = 2,
                   capacity: int = 2, max_ongoing: int = 8, matching_timeout: float = 1.0,
                   prewarm: tuple[str, ...] = ()) -> Path:
    """A MultiplexedDeployment manifest beside a copy of handlers.py (the replica imports it)."""
    shutil.copy(HERE / "handlers.py", folder / "handlers.py")
    manifest = {
        "apiVersion": "modelplex.io/v1alpha1",
        "kind": "MultiplexedDeployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "image": "local",
            "handler": handler,
            "multiplexing": {"maxModelsPerReplica": capacity, "matchingTimeoutSeconds": matching_timeout,
                             "prewarm": list(prewarm)},
            "maxOngoingRequests": max_ongoing,
        },
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(manifest))  # JSON is YAML
    return path


@dataclass(eq=False)
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Processes:
    """Every process a test started; :meth:`stop_all` ends each one (group), even on failure."""

    folder: Path
    env: dict = field(default_factory=lambda: dict(os.environ))
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict | None = None) -> Proc:
        log = self.folder / f"{name}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**self.env, **(env or {})}, start_new_session=True, cwd=self.folder)
        handle.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def replica(self, manifest: Path, port: int, name: str = "replica", env: dict | None = None) -> Proc:
        return self.start(name, [*MODELPLEX, "replica", "--spec", str(manifest), "--host", "127.0.0.1",
                                 "--port", str(port)], env)

    def router(self, manifest: Path, port: int, replicas: list[str], env: dict | None = None) -> Proc:
        argv = [*MODELPLEX, "router", "--spec", str(manifest), "--host", "127.0.0.1", "--port", str(port)]
        for replica in replicas:
            argv += ["--replica", replica]
        return self.start("router", argv, env)

    @staticmethod
    def stop(proc: Proc, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if proc.popen.poll() is None:
            try:
                os.killpg(proc.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)  # its group: nothing it started survives
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)

    def report(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.popen.poll()}) ---\n{p.tail()}" for p in self.procs)


@pytest.fixture
def processes(tmp_path: Path, request) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(procs.report())
        procs.stop_all()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@dataclass
class Cluster:
    """Replicas and one router of a deployment, all real processes."""

    manifest: Path
    router_url: str
    replica_urls: dict[str, str]  # name -> url
    replica_procs: dict[str, Proc]
    router_proc: Proc
    processes: Processes


async def wait_until(predicate, *, timeout: float = START_TIMEOUT_S, interval: float = 0.05, what: str = ""):
    """Poll an async predicate until it returns something truthy (bounded in time)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = await predicate()
            if last:
                return last
        except (aiohttp.ClientError, OSError, ValueError) as error:
            last = error
        await _sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}: last {last!r}")


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def table(session: aiohttp.ClientSession, router_url: str) -> dict[str, dict]:
    async with session.get(router_url + "/v1/replicas") as resp:
        assert resp.status == 200
        return {r["name"]: r for r in (await resp.json())["replicas"]}


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    """Sum of a metric's samples (all label values) from a /metrics page."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def start_cluster(processes: Processes, *, replicas: int = 2, router_env: dict | None = None,
                        replica_env: dict | None = None, **manifest_args) -> Cluster:
    manifest = write_manifest(processes.folder, replicas=replicas, **manifest_args)
    urls, procs = {}, {}
    for i in range(replicas):
        port = free_port()
        name = f"r{i}"
        urls[name] = f"http://127.0.0.1:{port}"
        procs[name] = processes.replica(manifest, port, name=f"replica-{name}", env=replica_env)
    router_port = free_port()
    router = processes.router(manifest, router_port, [f"{n}={u}" for n, u in urls.items()], env=router_env)
    cluster = Cluster(manifest, f"http://127.0.0.1:{router_port}", urls, procs, router, processes)
    async with aiohttp.ClientSession() as session:
        async def ready():
            for proc in processes.procs:
                assert proc.alive(), f"{proc.name} exited early:\n{proc.tail()}"
            async with session.get(cluster.router_url + "/readyz") as resp:
                return resp.status == 200 and (await resp.json())["ready_replicas"] == replicas

        await wait_until(ready, what="the router to see every replica ready")
    return cluster


class Plex:
    """The helpers a test gets through the ``plex`` fixture (test modules cannot import
    conftest under ``--import-mode=importlib``)."""

    free_port = staticmethod(free_port)
    wait_until = staticmethod(wait_until)
    table = staticmethod(table)
    metric = staticmethod(metric)

    def __init__(self, processes: Processes):
        self.processes = processes
        self.folder = processes.folder

    def write_manifest(self, **kwargs) -> Path:
        return write_manifest(self.folder, **kwargs)

    async def start(self, **kwargs) -> Cluster:
        return await start_cluster(self.processes, **kwargs)


@pytest.fixture
def plex(processes: Processes) -> Plex:
    return Plex(processes)
