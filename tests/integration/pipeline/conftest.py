"""Whole deployments for the pipeline tests, run by ``modelplex local`` as real processes.

Two stacks, each started once per module (a cold start costs seconds on two cores) and
always stopped, even when a test fails:

- ``composition``: ``upstream`` → ``downstream`` (``Upstream``/``Downstream`` in
  composition.py) and ``collector`` → ``producer``;
- ``video``: the example pipeline of examples/pipeline (its manifests and modules, copied),
  with the decoder swapped for ``traced:TracedDecode`` so tests can see what it did, one
  detect replica, and stage costs cut down so each test takes a few seconds.
"""

from __future__ import annotations

import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest
import yaml

from support.servers import MODELPLEX, Proc, Processes, descendants

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[2] / "examples" / "pipeline"
START_TIMEOUT_S = 120.0  # two cores, five torch imports at once: generous

#: Per-chunk stage costs for the tests: small, so a test is quick; the bench uses the defaults.
#: The naive orchestrator holds at most 4 MiB of video here (13 chunks), so a test can pass it.
FAST_STAGES = {"PIPELINE_DECODE_S": "0.002", "PIPELINE_DETECT_S": "0.01", "PIPELINE_ENCODE_S": "0.005",
               "PIPELINE_LOAD_S": "0.05", "PIPELINE_WINDOW": "4", "PIPELINE_NAIVE_MAX_BYTES": str(4 << 20)}


def consecutive_free_ports(count: int, host: str = "127.0.0.1") -> int:
    """A port P with P .. P+count-1 all free (local mode puts routers on consecutive ports)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((host, 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        held = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind((host, port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError(f"no {count} consecutive free ports")


@dataclass
class Stack:
    """A running ``modelplex local``: its process and each deployment's router URL."""

    proc: Proc
    urls: dict[str, str]
    folder: Path

    def url(self, deployment: str) -> str:
        return self.urls[deployment]

    def report(self) -> str:
        return f"--- modelplex local (exit {self.proc.popen.poll()}) ---\n{self.proc.tail(150)}"

    def pids(self) -> list[int]:
        """Every replica and router of this run (the processes below ``modelplex local``)."""
        return descendants(self.proc.popen.pid)

    def rss_bytes(self) -> int:
        """The resident memory of all of them together."""
        total = 0
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        return total


def start_local(processes: Processes, manifest: Path, deployments: int, env: dict | None = None) -> Stack:
    """Run ``modelplex local manifest`` and wait (bounded) until it says every router is ready."""
    port = consecutive_free_ports(deployments)
    proc = processes.start(f"local-{manifest.stem}", [*MODELPLEX, "local", str(manifest), "--port", str(port)], env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not proc.alive():
            raise AssertionError(f"modelplex local exited with {proc.popen.poll()}:\n{proc.tail(80)}")
        output = proc.log.read_text(errors="replace")
        if "Press Ctrl-C" in output:
            urls = dict(re.findall(r"^(\S+) is ready at (http://\S+)", output, flags=re.M))
            assert len(urls) == deployments, output
            return Stack(proc, urls, manifest.parent)
        time.sleep(0.1)
    raise AssertionError(f"modelplex local not ready after {START_TIMEOUT_S:g} s:\n{proc.tail(80)}")


def manifest(name: str, handler: str, **spec) -> dict:
    return {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "image": "local", "handler": handler, **spec}}


def write_documents(path: Path, documents: list[dict]) -> Path:
    path.write_text("\n---\n".join(yaml.safe_dump(document, sort_keys=False) for document in documents))
    return path


@pytest.fixture(scope="module")
def _processes(tmp_path_factory) -> Iterator[Processes]:
    processes = Processes(tmp_path_factory.mktemp("stack"))
    try:
        yield processes
    finally:
        processes.stop_all()


@pytest.fixture(scope="module")
def _composition_stack(_processes: Processes) -> Stack:
    folder = _processes.folder
    shutil.copy(HERE / "composition.py", folder / "composition.py")
    path = write_documents(folder / "composition.yaml", [
        manifest("upstream", "composition:Upstream"),
        manifest("downstream", "composition:Downstream", replicas=2, multiplexing={"maxModelsPerReplica": 2}),
        manifest("collector", "composition:Collector"),
        manifest("producer", "composition:Producer"),
    ])
    return start_local(_processes, path, deployments=4)


@pytest.fixture(scope="module")
def _video_stack(_processes: Processes) -> Stack:
    """The example's own manifests and modules, with the traced decoder and one detect replica."""
    folder = _processes.folder
    for module in ("frames.py", "stages.py", "orchestrators.py"):
        shutil.copy(EXAMPLE / module, folder / module)
    shutil.copy(HERE / "traced.py", folder / "traced.py")
    documents = list(yaml.safe_load_all((EXAMPLE / "pipeline.yaml").read_text()))
    for document in documents:
        spec = document["spec"]
        if document["metadata"]["name"] == "decode":
            assert spec["handler"] == "stages:Decode"
            spec["handler"] = "traced:TracedDecode"
        spec["replicas"] = 1  # two cores: one of each is enough to show the behaviour
    path = write_documents(folder / "pipeline.yaml", documents)
    return start_local(_processes, path, deployments=len(documents), env=FAST_STAGES)


def _reporting(stack: Stack, request) -> Iterator[Stack]:
    yield stack
    call = getattr(request.node, "rep_call", None)
    if call is not None and call.failed:
        print(stack.report())


@pytest.fixture
def composition(_composition_stack: Stack, request) -> Iterator[Stack]:
    yield from _reporting(_composition_stack, request)


@pytest.fixture
def video_stack(_video_stack: Stack, request) -> Iterator[Stack]:
    yield from _reporting(_video_stack, request)


@pytest.fixture
async def session() -> Iterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client

