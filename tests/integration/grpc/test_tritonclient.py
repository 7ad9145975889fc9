"""Triton's own gRPC clients (``tritonclient.grpc``, sync and asyncio) against the router, unchanged:
health, metadata, inference (answers equal to the REST path's), errors as gRPC codes, the
repository extension, and a generator deployment's answers streamed chunk by chunk."""

from __future__ import annotations

import asyncio
import queue
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
import tritonclient.http as triton_http
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from support.servers import metric_value

ROWS = np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(3, 16)
WAIT_S = 120.0  # a cold model load on two busy cores: generous
FLOOD_IDLE_S = 2.0  # the flood deployment's streamIdleTimeoutSeconds (conftest.py)


def client(stack, deployment: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(stack.grpc[deployment])


def rest_client(stack, deployment: str) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(stack.url(deployment).removeprefix("http://"), network_timeout=WAIT_S,
                                             connection_timeout=WAIT_S)


def rest_answer(stack, model: str, rows: np.ndarray) -> np.ndarray:
    """The same request over the REST protocol."""
    rest = rest_client(stack, "zoo")
    try:
        tensor = triton_http.InferInput("input", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        return rest.infer(model, [tensor]).as_numpy("output0")
    finally:
        rest.close()


def features(rows: np.ndarray = ROWS) -> triton.InferInput:
    tensor = triton.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return tensor


def test_tritonclient_sees_a_live_ready_server_its_metadata_and_a_servable_model(stack):
    with client(stack, "zoo") as zoo:
        assert zoo.is_server_live()
        assert zoo.is_server_ready()
        server = zoo.get_server_metadata()
        assert server.name == "modelplex"
        assert {"binary_tensor_data", "model_repository"} <= set(server.extensions)
        assert zoo.is_model_ready("mlp-a")
        assert zoo.is_model_ready("mlp-a", model_version="1")
        assert not zoo.is_model_ready("no-such-model")
        metadata = zoo.get_model_metadata("mlp-a", as_json=True)
        rest = rest_client(stack, "zoo")
        try:
            expected = rest.get_model_metadata("mlp-a")
        finally:
            rest.close()
        assert metadata["name"] == expected["name"] == "mlp-a"
        assert metadata["versions"] == expected["versions"] == ["1"]
        assert metadata["platform"] == expected["platform"] == "pytorch_torchscript"
        for side in ("inputs", "outputs"):  # protobuf's JSON writes int64 dims as strings
            got = [{**t, "shape": [int(d) for d in t["shape"]]} for t in metadata[side]]
            assert got == expected[side]


def test_the_standard_health_service_says_serving_for_the_server_and_the_inference_service(stack):
    with grpc.insecure_channel(stack.grpc["zoo"]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=WAIT_S)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as raised:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("model", ["mlp-a", "mlp-b"])
def test_infer_with_raw_contents_gives_the_rest_path_s_numbers(stack, model):
    with client(stack, "zoo") as zoo:
        outputs = [triton.InferRequestedOutput("output0")]
        result = zoo.infer(model, [features()], outputs=outputs, request_id="g-7", client_timeout=WAIT_S)
        response = result.get_response()
        assert response.model_name == model
        assert response.id == "g-7"
        got = result.as_numpy("output0")
        assert got.dtype == np.float32 and got.shape == (3, 4)
        np.testing.assert_allclose(got, rest_answer(stack, model, ROWS), rtol=1e-6, atol=1e-6)
        assert not np.allclose(got, rest_answer(stack, "mlp-b" if model == "mlp-a" else "mlp-a", ROWS))


def test_every_datatype_goes_through_raw_contents_and_comes_back(stack):
    samples = {
        "b": (np.array([[True, False]]), "BOOL"), "u8": (np.array([[1, 255]], dtype=np.uint8), "UINT8"),
        "u64": (np.array([[2**40]], dtype=np.uint64), "UINT64"), "i8": (np.array([[-5]], dtype=np.int8), "INT8"),
        "i64": (np.array([[2**50]], dtype=np.int64), "INT64"), "f16": (np.array([[0.5]], dtype=np.float16), "FP16"),
        "f32": (np.array([[0.25, 2]], dtype=np.float32), "FP32"), "f64": (np.array([[1e-3]]), "FP64"),
        "s": (np.array([[b"caf\xc3\xa9", b"\x00\xff"]], dtype=object), "BYTES"),
    }
    inputs = []
    for name, (array, datatype) in samples.items():
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    with client(stack, "echo") as echo:
        result = echo.infer("any", inputs, client_timeout=WAIT_S)
    for name, (array, _) in samples.items():
        got = result.as_numpy(f"{name}_echo")
        assert got.dtype == array.dtype, name
        assert got.tolist() == array.tolist(), name
    numeric = sum(float(a.astype(np.float64).sum()) for n, (a, _) in samples.items() if n != "s")
    assert result.as_numpy("total").tolist() == [numeric]


def test_an_unknown_model_is_not_found_and_a_wrong_shape_invalid_with_the_rest_message(stack):
    with client(stack, "zoo") as zoo:
        with pytest.raises(InferenceServerException) as raised:
            zoo.infer("no-such-model", [features()], client_timeout=WAIT_S)
        assert raised.value.status() == "StatusCode.NOT_FOUND"
        assert "no-such-model" in raised.value.message()
        wrong = np.zeros((2, 5), dtype=np.float32)
        with pytest.raises(InferenceServerException) as raised:
            zoo.infer("mlp-a", [features(wrong)], client_timeout=WAIT_S)
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        rest = rest_client(stack, "zoo")
        try:
            tensor = triton_http.InferInput("input", [2, 5], "FP32")
            tensor.set_data_from_numpy(wrong)
            with pytest.raises(InferenceServerException) as over_rest:
                rest.infer("mlp-a", [tensor])
        finally:
            rest.close()
        assert over_rest.value.status() == "400"
        assert raised.value.message() == over_rest.value.message()
        with pytest.raises(InferenceServerException) as raised:
            zoo.get_model_metadata("mlp-a", model_version="7")
        assert raised.value.status() == "StatusCode.NOT_FOUND"
        assert "no version '7'" in raised.value.message()
        with pytest.raises(InferenceServerException) as raised:
            zoo.get_model_config("mlp-a")  # not served by the router
        assert raised.value.status() == "StatusCode.UNIMPLEMENTED"


def test_a_message_over_max_request_bytes_is_refused_as_resource_exhausted(stack):
    big = np.zeros((1, 40_000), dtype=np.float32)  # 160 kB; echo's maxRequestBytes is 64 KiB
    tensor = triton.InferInput("big", list(big.shape), "FP32")
    tensor.set_data_from_numpy(big)
    with client(stack, "echo") as echo:
        with pytest.raises(InferenceServerException) as raised:
            echo.infer("any", [tensor], client_timeout=WAIT_S)
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        small = triton.InferInput("small", [1, 4], "FP32")
        small.set_data_from_numpy(big[:, :4])
        assert echo.infer("any", [small], client_timeout=WAIT_S).as_numpy("total").tolist() == [0.0]


def test_the_repository_extension_loads_lists_and_unloads(stack):
    with client(stack, "zoo") as zoo:
        zoo.load_model("mlp-b", client_timeout=WAIT_S)
        index = {m.name: m.state for m in zoo.get_model_repository_index().models}
        assert index.get("mlp-b") == "READY"
        zoo.unload_model("mlp-b", client_timeout=WAIT_S)
        for _ in range(100):  # the router learns of the eviction from its next poll
            if "mlp-b" not in {m.name for m in zoo.get_model_repository_index().models}:
                break
            time.sleep(0.1)
        assert "mlp-b" not in {m.name for m in zoo.get_model_repository_index().models}
        with pytest.raises(InferenceServerException) as raised:
            zoo.load_model("no-such-model", client_timeout=WAIT_S)
        assert raised.value.status() == "StatusCode.NOT_FOUND"


def countdown_inputs(start: int, gate: Path | None) -> list[triton.InferInput]:
    first = triton.InferInput("start", [1], "INT32")
    first.set_data_from_numpy(np.array([start], dtype=np.int32))
    inputs = [first]
    if gate is not None:
        tensor = triton.InferInput("gate", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([str(gate).encode()], dtype=object))
        inputs.append(tensor)
    return inputs


def is_final(result: triton.InferResult) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_a_generator_streams_its_answers_one_by_one_then_a_final_marker(stack, tmp_path):
    answers: queue.Queue = queue.Queue()
    gate = tmp_path / "gate"
    with client(stack, "countdown") as countdown:
        countdown.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            countdown.async_stream_infer("countdown", countdown_inputs(3, gate), request_id="c-1",
                                         enable_empty_final_response=True)
            for step in (3, 2, 1):
                result, error = answers.get(timeout=WAIT_S)
                assert error is None, error
                # This step arrived while the handler waits for the test to see it (its gate).
                assert result.as_numpy("step").tolist() == [step]
                assert result.as_numpy("square").tolist() == [float(step * step)]
                assert result.get_response().id == "c-1"
                assert not is_final(result)
                Path(f"{gate}.{step - 1}").touch()
            final, error = answers.get(timeout=WAIT_S)
            assert error is None, error
            assert is_final(final) and final.get_response().id == "c-1"
            assert not final.get_response().outputs
            # Without a gate it counts down at once; any model id reaches a handler without a loader.
            countdown.async_stream_infer("any-id", countdown_inputs(2, None), request_id="c-2",
                                         enable_empty_final_response=True)
            results = [answers.get(timeout=WAIT_S) for _ in range(3)]
        finally:
            countdown.stop_stream()
    assert [r.as_numpy("step").tolist() for r, e in results[:2]] == [[2], [1]]
    assert [is_final(r) for r, e in results] == [False, False, True]


def test_a_streamed_request_for_an_unknown_model_gets_its_error_and_the_stream_goes_on(stack):
    answers: queue.Queue = queue.Queue()
    with client(stack, "zoo") as zoo:
        zoo.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            zoo.async_stream_infer("no-such-model", [features()], request_id="bad")
            result, error = answers.get(timeout=WAIT_S)
            assert result is None and "no-such-model" in error.message()
            zoo.async_stream_infer("mlp-a", [features()], request_id="good")
            result, error = answers.get(timeout=WAIT_S)
        finally:
            zoo.stop_stream()
    assert error is None
    assert is_final(result)
    np.testing.assert_allclose(result.as_numpy("output0"), rest_answer(stack, "mlp-a", ROWS), rtol=1e-6, atol=1e-6)


def test_a_generator_that_fails_midway_ends_its_request_with_the_error(stack):
    answers: queue.Queue = queue.Queue()
    with client(stack, "countdown") as countdown:
        countdown.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            countdown.async_stream_infer("any", countdown_inputs(13, None), request_id="u-13",
                                         enable_empty_final_response=True)
            first, error = answers.get(timeout=WAIT_S)
            assert error is None and first.as_numpy("step").tolist() == [13] and not is_final(first)
            result, error = answers.get(timeout=WAIT_S)
            assert result is None and "13 is unlucky" in error.message()
            # The stream still serves the next request.
            countdown.async_stream_infer("any", countdown_inputs(1, None), request_id="u-1",
                                         enable_empty_final_response=True)
            results = [answers.get(timeout=WAIT_S) for _ in range(2)]
        finally:
            countdown.stop_stream()
    assert [(r.get_response().id, is_final(r)) for r, e in results] == [("u-1", False), ("u-1", True)]


async def test_the_asyncio_client_infers_and_streams(stack, tmp_path):
    async with triton_aio.InferenceServerClient(stack.grpc["zoo"]) as zoo:
        assert await zoo.is_server_ready()
        assert await zoo.is_model_ready("mlp-b")
        tensor = triton_aio.InferInput("input", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        result = await zoo.infer("mlp-b", [tensor], client_timeout=WAIT_S)
    np.testing.assert_allclose(result.as_numpy("output0"), rest_answer(stack, "mlp-b", ROWS), rtol=1e-6, atol=1e-6)

    gate = tmp_path / "gate"

    async def requests():
        yield {"model_name": "countdown", "inputs": countdown_inputs(2, gate), "request_id": "a-1",
               "enable_empty_final_response": True}

    steps = []
    async with triton_aio.InferenceServerClient(stack.grpc["countdown"]) as countdown:
        async for result, error in countdown.stream_infer(requests(), stream_timeout=WAIT_S):
            assert error is None, error
            if is_final(result):
                break
            steps.append(result.as_numpy("step").tolist())
            Path(f"{gate}.{steps[-1][0] - 1}").touch()  # the handler's next step waits for this
    assert steps == [[2], [1]]


def test_grpc_requests_are_counted_under_the_same_names_with_a_protocol_label(stack):
    with client(stack, "zoo") as zoo:
        zoo.infer("mlp-a", [features()], client_timeout=WAIT_S)
        with pytest.raises(InferenceServerException):
            zoo.infer("no-such-model", [features()], client_timeout=WAIT_S)
    with urllib.request.urlopen(stack.control_url("zoo") + "/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    assert metric_value(text, 'modelplex_router_requests_total{code="200",deployment="zoo",protocol="grpc"}') >= 1
    assert metric_value(text, 'modelplex_router_requests_total{code="404",deployment="zoo",protocol="grpc"}') >= 1
    assert 'modelplex_router_request_latency_seconds_count{deployment="zoo",protocol="grpc"}' in text


def test_a_generator_handler_through_one_shot_model_infer_is_invalid_argument_naming_model_stream_infer(stack):
    # One-shot ModelInfer cannot carry a stream: refused before the handler runs, once (never a
    # retried UNAVAILABLE), and the stream RPC still serves the same handler.
    with client(stack, "countdown") as countdown:
        with pytest.raises(InferenceServerException) as raised:
            countdown.infer("any", countdown_inputs(2, None), client_timeout=WAIT_S)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT", raised.value
    assert "ModelStreamInfer" in raised.value.message(), raised.value.message()


def flood_inputs(count: int) -> list:
    tensor = triton_aio.InferInput("count", [1], "INT64")
    tensor.set_data_from_numpy(np.array([count], dtype=np.int64))
    return [tensor]


async def test_a_stream_client_that_stops_reading_frees_its_slot_within_the_stream_idle_timeout(stack):
    """``flood`` has one slot (maxOngoingRequests 1) and a 2 s streamIdleTimeoutSeconds: a
    ModelStreamInfer client that takes one answer and then reads no more is cut, its slot freed
    for the next stream, and the cut counted as 499 under protocol="grpc"."""
    async def one(count: int, request_id: str):
        yield {"model_name": "flood", "inputs": flood_inputs(count), "request_id": request_id}
        await asyncio.sleep(3600)  # keep the request side open: the stream ends from the server

    async with triton_aio.InferenceServerClient(stack.grpc["flood"]) as stalled:
        answers = stalled.stream_infer(one(1_000_000, "stalled"), stream_timeout=WAIT_S)
        result, error = await asyncio.wait_for(answers.__anext__(), WAIT_S)
        assert error is None and result.as_numpy("block")[0] == 0  # the stream began; now nobody reads it
        stopped = time.monotonic()
        async with triton_aio.InferenceServerClient(stack.grpc["flood"]) as second:
            blocks = []
            async for result, error in second.stream_infer(one(2, "second"), stream_timeout=WAIT_S):
                assert error is None, error
                blocks.append(float(result.as_numpy("block")[0]))
                if len(blocks) == 2:
                    break
        assert blocks == [0.0, 1.0]
        assert time.monotonic() - stopped <= FLOOD_IDLE_S + 30  # freed by the cut, not by the end of the flood
    with urllib.request.urlopen(stack.control_url("flood") + "/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    assert metric_value(text, 'modelplex_router_requests_total{code="499",deployment="flood",protocol="grpc"}') >= 1
