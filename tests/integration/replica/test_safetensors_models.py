"""The built-in handler's ``format: safetensors`` in a real replica: state_dicts the test saves,
read from a ``file:`` folder (memory-mapped in place) and from an http store on loopback, put
into the user's class named by ``modelSource.module`` with its ``kwargs``."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp import web
from safetensors.torch import save_file

from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.oip import PROTOCOL, PROTOCOL_HEADER

from support.servers import serving, wait_ready

HERE = Path(__file__).resolve().parent
TIMEOUT = aiohttp.ClientTimeout(total=120)
KWARGS = {"width": 6, "hidden": 24, "out": 3}


@pytest.fixture
def store(tmp_path: Path) -> dict[str, torch.nn.Module]:
    """Two models saved as safetensors in tmp_path/store, and the modules they came from."""
    mlp = runpy.run_path(str(HERE / "nets.py"))["Mlp"]
    (tmp_path / "store").mkdir()
    models = {}
    for seed, name in enumerate(["a", "b"]):
        torch.manual_seed(seed)
        models[name] = mlp(**KWARGS).eval()
        save_file(models[name].state_dict(), str(tmp_path / "store" / f"{name}.safetensors"))
    return models


def write_manifest(folder: Path, uri: str, multiplexing: dict | None = None, **source) -> Path:
    shutil.copy(HERE / "nets.py", folder / "nets.py")
    path = folder / "st.yaml"
    path.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "st"},
        "spec": {"image": "local", "batching": {"batchWaitTimeoutMs": 1},
                 "multiplexing": {"maxModelsPerReplica": 1, **(multiplexing or {})},
                 "modelSource": {"uri": uri, "format": "safetensors", "module": "nets:Mlp", "kwargs": KWARGS,
                                 **source}},
    }))
    return path


async def answers_match(session: aiohttp.ClientSession, url: str, models: dict[str, torch.nn.Module]) -> None:
    rows = [[0.5, -1.0, 2.0, 0.0, 1.5, -0.25], [1.0] * 6]
    for name in ["a", "b", "a"]:  # one model per replica: each load evicts the other
        async with session.post(url + "/v1/invoke", json={"inputs": rows}, headers={MODEL_ID_HEADER: name}) as response:
            assert response.status == 200, await response.text()
            got = torch.tensor((await response.json())["outputs"])
        with torch.inference_mode():
            assert torch.allclose(got, models[name](torch.tensor(rows)), atol=1e-6), name


async def test_a_file_source_serves_the_saved_state_dicts_in_the_users_class(processes, tmp_path, store):
    replica = processes.replica(write_manifest(tmp_path, "file:store/{model_id}.safetensors"))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        await answers_match(session, replica.url, store)
        async with session.get(replica.url + "/v1/models/a/metadata") as response:
            assert response.status == 200, await response.text()
            metadata = await response.json()
        assert metadata["platform"] == "pytorch_safetensors"
        assert [(t["name"], t["shape"]) for t in metadata["inputs"]] == [("features", [-1, 6])]
        assert metadata["outputs"][0]["shape"] == [-1, 3]
        oip = {MODEL_ID_HEADER: "a", PROTOCOL_HEADER: PROTOCOL}  # as the router forwards /v2/models/a/infer
        async with session.post(replica.url + "/v1/invoke", headers=oip, json={"inputs": [
                {"name": "features", "datatype": "FP32", "shape": [1, 5], "data": [0.0] * 5}]}) as response:
            assert response.status == 400
            assert "expected shape [-1, 6]" in (await response.json())["error"]["message"]
        async with session.post(replica.url + "/v1/invoke", json={"inputs": [0.0] * 6},
                                headers={MODEL_ID_HEADER: "missing"}) as response:
            assert response.status == 404, await response.text()
        async with session.get(replica.url + "/v1/models") as response:
            document = await response.json()
        assert document["modelBytes"] == {"a": (6 * 24 + 24 + 24 * 3 + 3) * 4}  # measured: its parameters


async def test_an_http_source_and_its_disk_copies_serve_them_too_and_a_broken_file_is_a_load_error(
        processes, tmp_path, store):
    (tmp_path / "store" / "odd.safetensors").write_bytes((tmp_path / "store" / "a.safetensors").read_bytes()[:40])
    app = web.Application()
    app.router.add_static("/models", tmp_path / "store")
    async with serving(app) as url, aiohttp.ClientSession(timeout=TIMEOUT) as session:
        replica = processes.replica(write_manifest(tmp_path, url + "/models/{model_id}.safetensors",
                                                   multiplexing={"hostCacheBytes": "1Mi"}),
                                    env={"MODELPLEX_WARM_DIR": str(tmp_path / "warm")})
        await wait_ready(session, replica)
        await answers_match(session, replica.url, store)  # a, b, then a again from its disk copy
        page = await (await session.get(replica.url + "/metrics")).text()
        assert 'modelplex_model_loads_total{deployment="st",tier="warm"} 1.0' in page
        # a's weights are mapped from an in-memory copy of its disk copy, never from the tier's
        # file: a file the tier drops would otherwise keep its disk while the model is loaded.
        maps = Path(f"/proc/{replica.popen.pid}/maps").read_text()
        assert "/memfd:modelplex-model" in maps and str(tmp_path / "warm") not in maps
        async with session.post(replica.url + "/v1/invoke", json={"inputs": [0.0] * 6},
                                headers={MODEL_ID_HEADER: "odd"}) as response:
            assert response.status >= 500
            assert "'odd' is not a safetensors file" in await response.text()
        kept = [path for path in (tmp_path / "warm").iterdir() if not path.name.startswith(".")]
        assert len(kept) == 2  # a and b; a file that did not load is not kept


async def test_a_module_that_cannot_be_imported_stops_the_replica_naming_the_field(processes, tmp_path):
    manifest = write_manifest(tmp_path, "file:store/{model_id}.safetensors")
    (tmp_path / "nets.py").unlink()
    replica = processes.replica(manifest)
    assert replica.popen.wait(timeout=90) != 0
    assert "spec.modelSource.module: cannot import 'nets'" in replica.log.read_text()
