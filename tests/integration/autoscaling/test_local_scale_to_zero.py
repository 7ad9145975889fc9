"""``modelplex local`` with ``spec.autoscaling``: scale to zero, a request held while a replica
starts, the hot model pre-loaded, and back to zero when idle. Real processes, real torch models."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import torch

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import MODELPLEX, Processes, descendants, free_port, metric, wait_until

TIMEOUT = aiohttp.ClientTimeout(total=150)
INPUT = [0.5, -1.0, 2.0, 0.25]


def build_models(folder: Path, names: list[str]) -> dict[str, torch.jit.ScriptModule]:
    """One small TorchScript MLP per model id, different weights each."""
    folder.mkdir()
    models = {}
    for seed, name in enumerate(names):
        torch.manual_seed(seed)
        model = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),
                                                     torch.nn.Linear(16, 2)).eval())
        torch.jit.save(model, str(folder / f"{name}.pt"))
        models[name] = model
    return models


def manifest(folder: Path, models: Path) -> Path:
    path = folder / "scaled.yaml"
    path.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1",
        "kind": "MultiplexedDeployment",
        "metadata": {"name": "scaled"},
        "spec": {
            "image": "local",
            "modelSource": {"uri": f"file://{models}/{{model_id}}.pt"},
            "multiplexing": {"maxModelsPerReplica": 2},
            "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "targetOngoingRequests": 2,
                            "upscaleDelaySeconds": 1, "downscaleDelaySeconds": 4, "lookBackPeriodSeconds": 2},
        },
    }))
    return path


def replica_processes(pid: int) -> list[int]:
    found = []
    for child in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"replica" in argv:
            found.append(child)
    return found


async def test_an_idle_pool_is_at_zero_a_request_is_held_until_a_replica_serves_it_and_idle_goes_back_to_zero(
        processes: Processes, tmp_path: Path):
    models = build_models(tmp_path / "models", ["mlp-a", "mlp-b"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    local = processes.start("local", [*MODELPLEX, "local", str(manifest(tmp_path, tmp_path / "models")),
                                      "--port", str(port)])

    async def output_has(text: str) -> bool:
        local.check_running()
        return text in local.log.read_text(errors="replace")

    await wait_until(lambda: output_has("Press Ctrl-C"), timeout=120, what="modelplex local to start")
    assert "scaled to zero: the first request starts a replica" in local.log.read_text()
    assert replica_processes(local.popen.pid) == []  # an idle pool has no replica process

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async def load() -> dict:
            async with session.get(url + "/v1/load") as resp:
                assert resp.status == 200
                return await resp.json()

        report = await load()
        assert report["queued"] == 0 and not any(r["ready"] for r in report["replicas"])

        async def call(model: str) -> tuple[int, dict]:
            async with session.post(url + "/", json={"inputs": INPUT}, headers={MODEL_ID_HEADER: model}) as resp:
                return resp.status, await resp.json()

        held = asyncio.create_task(call("mlp-a"))
        # The router holds it and says so in its report: that is what starts a replica.
        async def queued():
            assert not held.done(), held.result()
            return (await load())["queued"] == 1
        await wait_until(queued, timeout=30, interval=0.05, what="the request to be held at zero")

        status, answer = await asyncio.wait_for(held, 120)
        assert status == 200, answer
        expected = models["mlp-a"](torch.tensor([INPUT])).detach()[0].tolist()
        assert torch.allclose(torch.tensor(answer["outputs"]), torch.tensor(expected), atol=1e-5), answer
        output = local.log.read_text()
        assert "scaled: 0 -> 1 replica(s) (1 request(s) waiting at zero replicas): starting scaled-0" in output
        assert len(replica_processes(local.popen.pid)) == 1
        # The held request's model was hot: the new replica pre-loaded it before it turned
        # ready, so the request was routed as a cache hit.
        # The router's metrics are on its control port, which the ready line names.
        control = "http://" + re.search(r"  control (\S+:\d+)", local.log.read_text()).group(1)
        assert await metric(session, control, "modelplex_router_cache_hits_total") == 1
        assert await metric(session, control, "modelplex_router_cache_misses_total") == 0

        # Idle: the 2 s average empties, 4 s later the replica is stopped.
        await wait_until(lambda: output_has("scaled: 1 -> 0 replica(s) (idle for 4 s): stopping scaled-0"),
                         timeout=60, interval=0.2, what="the idle pool to scale to zero")

        async def no_replica():
            return replica_processes(local.popen.pid) == []
        await wait_until(no_replica, timeout=60, interval=0.2, what="the replica process to exit")
        report = await load()
        assert not any(r["ready"] for r in report["replicas"])
        assert report["model_rates"]["mlp-a"] > 0  # still remembered: the next replica pre-loads it
