"""Real third-party Open Inference Protocol clients against the router: tritonclient (HTTP, JSON
and binary tensors) and KServe's v2 REST client, on the built-in TorchScript handler and on a
handler that takes tensors of every datatype."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from modelplex.wire.names import MODEL_ID_HEADER

KSERVE_CLIENT = Path(__file__).resolve().parent / "kserve_rest_client.py"

ROWS = np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(3, 16)


def native(router_url: str, model: str, rows: np.ndarray) -> np.ndarray:
    """The same model through the native JSON path."""
    request = urllib.request.Request(router_url + "/", data=json.dumps({"inputs": rows.tolist()}).encode(),
                                     headers={MODEL_ID_HEADER: model, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return np.asarray(json.loads(response.read())["outputs"], dtype=np.float32)


def expected(zoo, model: str, rows: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.load(str(zoo.folder / "models" / f"{model}.pt"))
        return module(torch.from_numpy(rows)).numpy()


def triton_client(url: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=60.0, connection_timeout=60.0)


def test_tritonclient_sees_a_live_ready_server_and_a_servable_model(zoo):
    client = triton_client(zoo.router_url)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        server = client.get_server_metadata()
        assert server["name"] == "modelplex"
        assert {"binary_tensor_data", "model_repository"} <= set(server["extensions"])
        assert client.is_model_ready("mlp-a")
        assert client.is_model_ready("mlp-a", model_version="1")
        metadata = client.get_model_metadata("mlp-a")
        assert metadata["name"] == "mlp-a"
        assert metadata["versions"] == ["1"]
        assert metadata["platform"] == "pytorch_torchscript"
        assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
        assert metadata["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [-1, 4]}]
        declared = client.get_model_metadata("declared")
        assert declared["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
        assert declared["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 4]}]
    finally:
        client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_infer_gives_the_numbers_of_the_native_path(zoo, binary):
    client = triton_client(zoo.router_url)
    try:
        tensor = triton.InferInput("input", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS, binary_data=binary)
        outputs = [triton.InferRequestedOutput("output0", binary_data=binary)]
        result = client.infer("mlp-a", [tensor], outputs=outputs, request_id="req-7")
        got = result.as_numpy("output0")
        response = result.get_response()
        assert response["model_name"] == "mlp-a"
        assert response["id"] == "req-7"
        assert got.dtype == np.float32 and got.shape == (3, 4)
        np.testing.assert_allclose(got, native(zoo.router_url, "mlp-a", ROWS), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, expected(zoo, "mlp-a", ROWS), rtol=1e-5, atol=1e-6)
        # The client's defaults (binary input, every output binary, no content type) work too.
        plain = triton.InferInput("input", list(ROWS.shape), "FP32")
        plain.set_data_from_numpy(ROWS)
        np.testing.assert_array_equal(client.infer("mlp-a", [plain]).as_numpy("output0"), got)
    finally:
        client.close()


def test_tritonclient_unknown_model_is_not_ready_and_infer_is_a_404_with_an_oip_error(zoo):
    client = triton_client(zoo.router_url)
    try:
        assert not client.is_model_ready("no-such-model")
        tensor = triton.InferInput("input", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        with pytest.raises(InferenceServerException) as raised:
            client.infer("no-such-model", [tensor])
        assert raised.value.status() == "404"
        assert "no-such-model" in raised.value.message()
        with pytest.raises(InferenceServerException, match="no version '7'"):
            client.get_model_metadata("mlp-a", model_version="7")
    finally:
        client.close()


def test_tritonclient_bad_tensors_are_a_400_with_the_reason(zoo):
    client = triton_client(zoo.router_url)
    try:
        wrong = np.zeros((2, 5), dtype=np.float32)
        tensor = triton.InferInput("input", list(wrong.shape), "FP32")
        tensor.set_data_from_numpy(wrong)
        with pytest.raises(InferenceServerException, match=r"input 'input': expected shape \[-1, 16\].*got \[2, 5\]") as raised:
            client.infer("mlp-a", [tensor])
        assert raised.value.status() == "400"
        good = triton.InferInput("input", [1, 16], "FP32")
        good.set_data_from_numpy(ROWS[:1])
        with pytest.raises(InferenceServerException, match="unknown output 'nope'"):
            client.infer("mlp-a", [good], outputs=[triton.InferRequestedOutput("nope")])
    finally:
        client.close()


def test_every_datatype_reaches_a_handler_as_numpy_and_comes_back(stack):
    samples = {
        "b": np.array([[True, False, True]]), "u8": np.array([[1, 255]], dtype=np.uint8),
        "u16": np.array([[7]], dtype=np.uint16), "u32": np.array([[2**32 - 1]], dtype=np.uint32),
        "u64": np.array([[2**40]], dtype=np.uint64), "i8": np.array([[-5]], dtype=np.int8),
        "i16": np.array([[-300]], dtype=np.int16), "i32": np.array([[-(2**31)]], dtype=np.int32),
        "i64": np.array([[2**50]], dtype=np.int64), "f16": np.array([[0.5, 1.5]], dtype=np.float16),
        "f32": np.array([[0.25]], dtype=np.float32), "f64": np.array([[1e-3]], dtype=np.float64),
        "s": np.array([[b"caf\xc3\xa9", b"x"]], dtype=object),
    }
    datatypes = {"b": "BOOL", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64", "i8": "INT8",
                 "i16": "INT16", "i32": "INT32", "i64": "INT64", "f16": "FP16", "f32": "FP32", "f64": "FP64",
                 "s": "BYTES"}
    client = triton_client(stack["tensors"].router_url)
    try:
        for binary in (True, False):
            inputs = []
            for name, array in samples.items():
                tensor = triton.InferInput(name, list(array.shape), datatypes[name])
                tensor.set_data_from_numpy(array, binary_data=binary)
                inputs.append(tensor)
            outputs = [triton.InferRequestedOutput(f"{n}_echo", binary_data=binary) for n in samples]
            result = client.infer("any", inputs, outputs=outputs + [triton.InferRequestedOutput("total")])
            for name, array in samples.items():
                got = result.as_numpy(f"{name}_echo")
                if name == "s" and not binary:  # JSON BYTES come back as text
                    got = np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(got)
                assert got.dtype == array.dtype or name == "s", name
                assert got.tolist() == array.tolist(), (name, binary)
            numeric = sum(float(a.astype(np.float64).sum()) for n, a in samples.items() if n != "s")
            assert result.as_numpy("total").tolist() == [numeric]
    finally:
        client.close()


def kserve_rest(router_url: str, model: str) -> dict:
    """What KServe's REST client saw, run in a process of its own (kserve_rest_client.py says why)."""
    run = subprocess.run([sys.executable, str(KSERVE_CLIENT), router_url, model], input=json.dumps(ROWS.tolist()),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_kserve_v2_client_live_ready_and_infer_match_the_native_path(zoo):
    seen = kserve_rest(zoo.router_url, "mlp-b")
    assert seen["live"] is True and seen["ready"] is True and seen["model_ready"] is True
    expected = native(zoo.router_url, "mlp-b", ROWS)
    for kind in ("json", "binary"):
        answer = seen[kind]
        assert (answer["id"], answer["model"], answer["name"]) == ("k-1", "mlp-b", "output0")
        np.testing.assert_allclose(np.asarray(answer["data"], dtype=np.float32), expected, rtol=1e-6, atol=1e-6)


def test_kserve_v2_client_unknown_model_is_a_404_with_an_oip_error(zoo):
    seen = kserve_rest(zoo.router_url, "mlp-b")
    assert seen["nobody_ready"] is False
    assert seen["nobody"]["status"] == 404
    error = seen["nobody"]["body"]["error"]
    assert isinstance(error, str) and "nobody" in error


def test_oip_requests_are_batched_together(zoo):
    """Concurrent OIP requests for one model share forward passes (the replica's batch sizes)."""

    def batches() -> tuple[float, float]:
        with urllib.request.urlopen(zoo.replica_url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            for name in ("modelplex_batch_size_sum", "modelplex_batch_size_count"):
                if line.startswith(name + "{"):
                    values[name] = float(line.rsplit(" ", 1)[1])
        return values["modelplex_batch_size_sum"], values["modelplex_batch_size_count"]

    before = batches()
    client = triton.InferenceServerClient(zoo.router_url.removeprefix("http://"), concurrency=8,
                                          network_timeout=60.0)
    try:
        tensor = triton.InferInput("input", [1, 16], "FP32")
        tensor.set_data_from_numpy(ROWS[:1])
        pending = [client.async_infer("mlp-a", [tensor]) for _ in range(16)]
        results = [p.get_result().as_numpy("output0") for p in pending]
    finally:
        client.close()
    for result in results:  # a batch's size changes the last bits of a matmul, nothing more
        np.testing.assert_allclose(result, results[0], rtol=1e-6, atol=1e-7)
    after = batches()
    requests, count = after[0] - before[0], after[1] - before[1]
    assert requests == 16
    assert count < 16, f"16 concurrent requests ran in {count:g} batches"


async def test_repository_extension_loads_lists_and_unloads(zoo):
    async with httpx.AsyncClient(base_url=zoo.router_url, timeout=60) as http:
        loaded = await http.post("/v2/repository/models/mlp-b/load")
        assert loaded.status_code == 200, loaded.text

        async def index() -> dict[str, str]:
            response = await http.post("/v2/repository/index", json={})
            assert response.status_code == 200
            return {entry["name"]: entry["state"] for entry in response.json()}

        assert (await index()).get("mlp-b") == "READY"
        unloaded = await http.post("/v2/repository/models/mlp-b/unload")
        assert unloaded.status_code == 200, unloaded.text
        assert "mlp-b" not in await index()  # at once: the router's table took its own unload in
        missing = await http.post("/v2/repository/models/no-such-model/load")
        assert missing.status_code == 404
        assert "no-such-model" in missing.json()["error"]


def test_a_handler_without_a_model_loader_is_ready_and_described_by_name(stack):
    client = triton_client(stack["tensors"].router_url)
    try:
        assert client.is_model_ready("anything")
        metadata = client.get_model_metadata("anything")
        assert metadata == {"name": "anything", "versions": ["1"], "platform": "modelplex", "inputs": [],
                            "outputs": []}
    finally:
        client.close()
