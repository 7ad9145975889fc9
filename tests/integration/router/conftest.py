"""Real replicas and routers as processes on loopback, started and always stopped by fixtures."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from support.servers import Proc, Processes, free_port, metric, wait_until

HERE = Path(__file__).resolve().parent


def write_manifest(folder: Path, *, name: str = "plex", handler: str = "handlers:Echo", replicas: int = 2,
                   capacity: int = 2, max_ongoing: int = 8, matching_timeout: float = 1.0,
                   prewarm: tuple[str, ...] = (), models: list[dict] | None = None,
                   spec: dict | None = None) -> Path:
    """A MultiplexedDeployment manifest beside a copy of handlers.py (the replica imports it);
    ``models``: ``spec.models``; ``spec``: more fields of the spec (``router``, ...)."""
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
            **({"models": models} if models is not None else {}),
            **(spec or {}),
        },
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(manifest))  # JSON is YAML
    return path


@dataclass
class Cluster:
    """Replicas and one router of a deployment, all real processes."""

    manifest: Path
    router_url: str
    replica_urls: dict[str, str]  # name -> url
    control_urls: dict[str, str]  # name -> its control port's url (probes and metrics, as in pods)
    replica_procs: dict[str, Proc]
    router_proc: Proc
    processes: Processes

    @property
    def router_control_url(self) -> str:
        """The router's control port: its /metrics (and /healthz, /readyz)."""
        return self.router_proc.control_url


async def table(session: aiohttp.ClientSession, router_url: str) -> dict[str, dict]:
    async with session.get(router_url + "/v1/replicas") as resp:
        assert resp.status == 200
        return {r["name"]: r for r in (await resp.json())["replicas"]}


async def start_cluster(processes: Processes, *, replicas: int = 2, router_env: dict | None = None,
                        replica_env: dict | None = None, **manifest_args) -> Cluster:
    manifest = write_manifest(processes.folder, replicas=replicas, **manifest_args)
    urls, controls, procs = {}, {}, {}
    for i in range(replicas):
        port, control_port = free_port(), free_port()
        name = f"r{i}"
        urls[name] = f"http://127.0.0.1:{port}"
        controls[name] = f"http://127.0.0.1:{control_port}"
        procs[name] = processes.replica(manifest, port, name=f"replica-{name}", env=replica_env,
                                        control_port=control_port)
    router_port = free_port()
    router = processes.router(manifest, router_port, [f"{n}={u}" for n, u in urls.items()], env=router_env)
    cluster = Cluster(manifest, f"http://127.0.0.1:{router_port}", urls, controls, procs, router, processes)
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
