"""Ids that do not exist neither flush the cache nor drive the loaded-models version.

A real replica serving the built-in handler from a file: source, with ``maxModelBytes`` set so
that one more model would force an eviction.
"""

from __future__ import annotations

import json
import warnings

import aiohttp
import torch

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import wait_ready

WIDTH = 256  # a Linear(256, 256): 263,168 bytes of float32 weights and bias


def save_model(path, seed: int) -> None:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(torch.nn.Linear(WIDTH, WIDTH).eval()), str(path))


async def test_two_hundred_missing_ids_keep_the_loaded_models_and_barely_move_the_version(processes, tmp_path):
    (tmp_path / "models").mkdir()
    for seed, name in enumerate(["hot-a", "hot-b"]):
        save_model(tmp_path / "models" / f"{name}.pt", seed)
    manifest = tmp_path / "missing.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "missing"},
        "spec": {"image": "local", "modelSource": {"uri": "file:models/{model_id}.pt"},
                 "multiplexing": {"maxModelBytes": 600_000, "maxModelsPerReplica": 10},  # two fit, not three
                 "batching": {"batchWaitTimeoutMs": 1}}}))
    replica = processes.replica(manifest)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await wait_ready(session, replica)

        async def call(model_id: str) -> tuple[int, dict]:
            async with session.post(replica.url + "/v1/invoke", json={"inputs": [0.5] * WIDTH},
                                    headers={MODEL_ID_HEADER: model_id}) as response:
                return response.status, await response.json()

        async def models() -> dict:
            async with session.get(replica.url + "/v1/models") as response:
                return await response.json()

        for name in ("hot-a", "hot-b"):
            assert (await call(name))[0] == 200
        before = await models()
        assert sorted(before["models"]) == ["hot-a", "hot-b"]
        statuses = []
        for i in range(200):
            status, body = await call(f"ghost-{i % 120}")  # distinct ids, and some asked again
            statuses.append(status)
            assert body["error"]["code"] == "model_not_found"
        after = await models()
    assert statuses == [404] * 200
    assert sorted(after["models"]) == ["hot-a", "hot-b"]  # nothing was evicted for a model that is not there
    assert 1 <= after["version"] - before["version"] <= 20, (before["version"], after["version"])
    assert after["failures"] and all(f["model"].startswith("ghost-") for f in after["failures"])
