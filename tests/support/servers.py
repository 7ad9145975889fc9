"""Helpers for tests that run real servers as processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp
import pytest
from aiohttp import web

from modelplex.processes import descendants, free_port, log_tail, running, spawn, stop, wait_for_async

__all__ = ["MODELPLEX", "START_TIMEOUT_S", "Proc", "Processes", "descendants", "free_port", "metric", "metric_value",
           "report_if_failed", "serving", "wait_ready", "wait_until"]

MODELPLEX = [sys.executable, "-m", "modelplex_launcher.cli"]
START_TIMEOUT_S = 90.0  # two cores and cold torch imports: generous
#: What a poll of a server that is still starting may raise: not yet, try again.
NOT_YET = (aiohttp.ClientError, OSError, ValueError)


@dataclass(eq=False)
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    url: str = ""
    #: A router's control port (its ``/metrics``; ``/healthz`` and ``/readyz`` too), else "".
    control_url: str = ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 60) -> str:
        return log_tail(self.log, lines)

    def check_running(self) -> None:
        """Raise :class:`~modelplex.processes.ProcessExited`, with the end of its log, if it exited."""
        running(self.popen, self.name, self.log)


@dataclass
class Processes:
    """Every process a test started (each in a group of its own, dying with the test run);
    :meth:`stop_all` ends each one's group, even on failure."""

    folder: Path
    env: dict = field(default_factory=lambda: dict(os.environ))
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict | None = None, url: str = "") -> Proc:
        log = self.folder / f"{name}.log"
        log.write_bytes(b"")  # a process started again under its name starts a fresh log
        popen = spawn(argv, log=log, env={**self.env, **(env or {})}, cwd=self.folder)
        proc = Proc(name, popen, log, url)
        self.procs.append(proc)
        return proc

    def replica(self, manifest: Path, port: int | None = None, name: str = "replica", env: dict | None = None,
                control_port: int | None = None) -> Proc:
        """A replica process; ``control_port``: its probes and metrics there too, as in pods."""
        port = port or free_port()
        argv = [*MODELPLEX, "replica", "--spec", str(manifest), "--host", "127.0.0.1", "--port", str(port)]
        if control_port is not None:
            argv += ["--control-port", str(control_port)]
        return self.start(name, argv, env, url=f"http://127.0.0.1:{port}")

    def router(self, manifest: Path, port: int, replicas: list[str], env: dict | None = None,
               control_port: int | None = None) -> Proc:
        """A router over static replicas (``NAME=URL`` or ``URL``); its control port (metrics) is
        ``control_port``, else a free one (:attr:`Proc.control_url`)."""
        control_port = control_port or free_port()
        argv = [*MODELPLEX, "router", "--spec", str(manifest), "--host", "127.0.0.1", "--port", str(port),
                "--control-port", str(control_port)]
        for replica in replicas:
            argv += ["--replica", replica]
        proc = self.start("router", argv, env, url=f"http://127.0.0.1:{port}")
        proc.control_url = f"http://127.0.0.1:{control_port}"
        return proc

    @staticmethod
    def stop(proc: Proc, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        stop(proc.popen, grace=timeout, sig=sig)  # its group: nothing it started survives

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)

    def report(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.popen.poll()}) ---\n{p.tail()}" for p in self.procs)


async def wait_until(predicate, *, timeout: float = START_TIMEOUT_S, interval: float = 0.05, what: str = "", guard=None):
    """Poll an async predicate until it returns something truthy (bounded in time); a server
    that does not answer yet is "not yet", any other error fails at once."""
    return await wait_for_async(predicate, timeout, interval, what, retry_on=NOT_YET, guard=guard)


async def wait_ready(session: aiohttp.ClientSession, proc: Proc, timeout: float = START_TIMEOUT_S) -> None:
    """Wait until ``proc`` answers /readyz with 200; fail at once if it exits."""
    async def ready():
        async with session.get(proc.url + "/readyz") as response:
            return response.status == 200

    await wait_until(ready, timeout=timeout, what=f"{proc.name} ready", guard=proc.check_running)


def metric_value(text: str, name: str) -> float:
    """Sum of a metric's samples (all label values) in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as response:
        return metric_value(await response.text(), name)


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` in this process on a free loopback port; yields its base URL and always
    cleans it up."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def report_if_failed(request: pytest.FixtureRequest, report: Callable[[], str]) -> None:
    """Print ``report()`` (the processes' log tails) when the test that used the fixture failed;
    the integration conftest's ``pytest_runtest_makereport`` hook records the outcome on the item."""
    call = getattr(request.node, "rep_call", None)
    if call is not None and call.failed:
        print(report())
