"""The built-in handler's warm tier on CPU: a local-disk copy of each fetched file, so a model
evicted and asked for again is read from disk, not from its (slow) store."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import aiohttp
import pytest
import torch
from aiohttp import web

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import metric, serving, wait_ready

TIMEOUT = aiohttp.ClientTimeout(total=120)
STORE_DELAY_S = 1.0  # a remote object store's latency, much above a local disk read


@pytest.fixture
async def model_store(tmp_path):
    """TorchScript models over HTTP on loopback, answering after STORE_DELAY_S; counts fetches."""
    folder = tmp_path / "store"
    folder.mkdir()
    for index, name in enumerate(["a", "b", "c"]):
        torch.manual_seed(index)
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4))
        torch.jit.save(torch.jit.script(model.eval()), str(folder / f"{name}.pt"))
    fetches: Counter[str] = Counter()

    @web.middleware
    async def slow(request, handler):
        fetches[request.path.rsplit("/", 1)[-1]] += 1
        await asyncio.sleep(STORE_DELAY_S)
        return await handler(request)

    app = web.Application(middlewares=[slow])
    app.router.add_static("/models", folder)
    async with serving(app) as url:
        yield f"{url}/models/{{model_id}}.pt", fetches, folder


async def infer(session, url, model_id):
    started = time.monotonic()
    async with session.post(url + "/v1/invoke", json={"inputs": [1.0] * 512},
                            headers={MODEL_ID_HEADER: model_id}) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["outputs"], time.monotonic() - started


async def test_an_evicted_model_comes_back_from_the_disk_copy(processes, tmp_path, model_store):
    uri, fetches, folder = model_store
    manifest = tmp_path / "builtin.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "builtin"},
        "spec": {"image": "local", "modelSource": {"uri": uri}, "batching": {"batchWaitTimeoutMs": 1},
                 "multiplexing": {"maxModelsPerReplica": 1, "hostCacheBytes": "10Mi"}},
    }))
    warm_dir = tmp_path / "warm"
    replica = processes.replica(manifest, env={"MODELPLEX_WARM_DIR": str(warm_dir)})
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        first, cold_s = await infer(session, replica.url, "a")
        await infer(session, replica.url, "b")  # a is evicted: only its disk copy remains
        again, warm_s = await infer(session, replica.url, "a")
        assert again == first
        assert fetches == {"a.pt": 1, "b.pt": 1}  # the store was asked once per model
        assert cold_s >= STORE_DELAY_S > warm_s, (cold_s, warm_s)
        page = await (await session.get(replica.url + "/metrics")).text()
        assert 'modelplex_model_loads_total{deployment="builtin",tier="cold"} 2.0' in page
        assert 'modelplex_model_loads_total{deployment="builtin",tier="warm"} 1.0' in page
        async with session.get(replica.url + "/v1/models") as response:
            document = await response.json()
        parameters = (512 * 512 + 512 + 4 * 512 + 4) * 4
        assert document["modelBytes"] == {"a": parameters}  # measured: its parameters' bytes
        assert sorted(p.stat().st_size for p in warm_dir.iterdir()) == sorted(
            (folder / f"{m}.pt").stat().st_size for m in "ab")
        assert await metric(session, replica.url, "modelplex_model_bytes") == parameters
    replica_log = replica.log.read_text()
    assert "Loaded model 'a' in" in replica_log and "(warm, 1.0 MiB)" in replica_log
