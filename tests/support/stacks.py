"""``modelplex local`` stacks for integration tests: start one, wait until ready, find its routers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from modelplex.processes import consecutive_free_ports, descendants, wait_for
from modelplex.wire.ready import READY_FILE_OPTION, read_ready_file

from support.servers import MODELPLEX, Proc, Processes

START_TIMEOUT_S = 120.0  # two cores, several torch imports at once: generous


@dataclass
class Stack:
    """A running ``modelplex local``: its process, each deployment's router URL and gRPC address."""

    proc: Proc
    urls: dict[str, str]
    folder: Path
    grpc: dict[str, str] = field(default_factory=dict)
    #: Each router's control port (``host:port``): its ``/healthz``, ``/readyz`` and ``/metrics``.
    control: dict[str, str] = field(default_factory=dict)

    def url(self, deployment: str) -> str:
        return self.urls[deployment]

    def control_url(self, deployment: str) -> str:
        """The base URL of the router's control port: where its metrics are."""
        return f"http://{self.control[deployment]}"

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
    """Run ``modelplex local manifest`` and wait (bounded) until its ready file says every router is ready."""
    port = consecutive_free_ports(deployments)
    ready_file = processes.folder / f"local-{manifest.stem}.ready.json"
    ready_file.unlink(missing_ok=True)  # a run started again under its name: not the last one's file
    proc = processes.start(f"local-{manifest.stem}",
                           [*MODELPLEX, "local", str(manifest), "--port", str(port), READY_FILE_OPTION, str(ready_file)],
                           env=env)
    ready = wait_for(lambda: read_ready_file(ready_file), START_TIMEOUT_S, 0.1,
                     f"modelplex local ready (its output: {proc.log})", guard=proc.check_running)
    assert len(ready.deployments) == deployments, proc.tail(150)
    return Stack(proc, ready.urls, manifest.parent, ready.grpc, ready.control)


def manifest(name: str, handler: str, **spec) -> dict:
    return {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "image": "local", "handler": handler, **spec}}


def write_documents(path: Path, documents: list[dict]) -> Path:
    path.write_text("\n---\n".join(yaml.safe_dump(document, sort_keys=False) for document in documents))
    return path
