"""Helpers for tests that run real servers as processes on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

MODELPLEX = [sys.executable, "-m", "modelplex.cli"]
START_TIMEOUT_S = 90.0  # two cores and cold torch imports: generous


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(eq=False)
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    url: str = ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Processes:
    """Every process a test started; :meth:`stop_all` ends each one's process group, even on failure."""

    folder: Path
    env: dict = field(default_factory=lambda: dict(os.environ))
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict | None = None, url: str = "") -> Proc:
        log = self.folder / f"{name}.log"
        with log.open("wb") as handle:
            popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**self.env, **(env or {})}, start_new_session=True, cwd=self.folder)
        proc = Proc(name, popen, log, url)
        self.procs.append(proc)
        return proc

    def replica(self, manifest: Path, port: int | None = None, name: str = "replica", env: dict | None = None) -> Proc:
        port = port or free_port()
        argv = [*MODELPLEX, "replica", "--spec", str(manifest), "--host", "127.0.0.1", "--port", str(port)]
        return self.start(name, argv, env, url=f"http://127.0.0.1:{port}")

    def router(self, manifest: Path, port: int, replicas: list[str], env: dict | None = None) -> Proc:
        """A router over static replicas (``NAME=URL`` or ``URL``)."""
        argv = [*MODELPLEX, "router", "--spec", str(manifest), "--host", "127.0.0.1", "--port", str(port)]
        for replica in replicas:
            argv += ["--replica", replica]
        return self.start("router", argv, env, url=f"http://127.0.0.1:{port}")

    @staticmethod
    def stop(proc: Proc, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        for signal_number, wait_s in ((sig, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.popen.pid, signal_number)  # its group: nothing it started survives
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.popen.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)

    def report(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.popen.poll()}) ---\n{p.tail()}" for p in self.procs)


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
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}: last {last!r}")


async def wait_ready(session: aiohttp.ClientSession, proc: Proc, timeout: float = START_TIMEOUT_S) -> None:
    async def ready():
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited with {proc.popen.poll()}:\n{proc.tail()}")
        async with session.get(proc.url + "/readyz") as response:
            return response.status == 200

    await wait_until(ready, timeout=timeout, what=f"{proc.name} ready")


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


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the replicas and routers of a ``modelplex local``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found
