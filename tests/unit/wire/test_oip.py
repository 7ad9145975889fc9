"""The Open Inference Protocol codec against tritonclient's own request and response code."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from modelplex.wire.errors import BadRequest
from modelplex.wire.oip import (DATATYPES, InferRequest, StreamFrames, as_outputs, datatype_of, decode_request,
                                encode_response, stream_frame)

SAMPLES = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([[0, 255]], dtype=np.uint8),
    "UINT16": np.array([[1, 65535]], dtype=np.uint16),
    "UINT32": np.array([[1, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[1, 2**63]], dtype=np.uint64),
    "INT8": np.array([[-128, 127]], dtype=np.int8),
    "INT16": np.array([[-3, 3]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**62), 2**62]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25]], dtype=np.float16),
    "FP32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    "FP64": np.array([[1e-300, 3.5]], dtype=np.float64),
    "BYTES": np.array([[b"hello", "héllo".encode(), b""]], dtype=object),
}


def triton_request(arrays: dict[str, np.ndarray], *, binary: bool, outputs=None) -> tuple[bytes, int | None]:
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), datatype_of(array))
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs=outputs, request_id="r-1")
    return body, json_size


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_datatype_decodes_as_tritonclient_encodes_it(binary):
    assert set(SAMPLES) == set(DATATYPES)
    body, json_size = triton_request(SAMPLES, binary=binary)
    request = decode_request(body, json_size)
    assert request.id == "r-1"
    assert list(request.inputs) == list(SAMPLES)
    for name, expected in SAMPLES.items():
        got = request[name]
        assert got.shape == expected.shape, name
        assert datatype_of(got) == name
        assert got.tolist() == expected.tolist(), name


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_datatype_encodes_so_that_tritonclient_reads_it_back(binary):
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in SAMPLES]
    body, json_size = triton_request({"x": SAMPLES["FP32"]}, binary=True, outputs=outputs)
    request = decode_request(body, json_size)
    request.model_name = "m"
    answer, header_length = encode_response(request, SAMPLES)
    assert (header_length is not None) == binary
    result = triton.InferenceServerClient.parse_response_body(answer, header_length=header_length)
    assert result.get_response()["model_name"] == "m"
    assert result.get_response()["id"] == "r-1"
    for name, expected in SAMPLES.items():
        got = result.as_numpy(name)
        if name == "BYTES" and not binary:
            got = np.array([[v.encode() if isinstance(v, str) else v for v in row] for row in got], dtype=object)
        assert got.shape == expected.shape, name
        assert got.tolist() == expected.tolist(), name


def test_nested_json_data_is_read_row_major():
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}]})
    assert decode_request(body)["x"].tolist() == [[1, 2], [3, 4]]


def test_only_the_requested_outputs_are_sent():
    request = decode_request(orjson.dumps({"inputs": [], "outputs": [{"name": "b"}]}))
    body, _ = encode_response(request, {"a": np.zeros(1), "b": np.ones(2, dtype=np.float32)})
    document = orjson.loads(body)
    assert [o["name"] for o in document["outputs"]] == ["b"]
    assert document["outputs"][0] == {"name": "b", "datatype": "FP32", "shape": [2], "data": [1.0, 1.0]}


@pytest.mark.parametrize("document, message", [
    ({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}, "2 values for shape [3]"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP33", "data": [1]}]}, "datatype must be one of"),
    ({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}, "non-negative integers"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [300]}]}, "out of range for INT8"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}]}, "must be integers"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}]}, "true or false"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "binary_data_size"),
    ({"inputs": {"x": 1}}, '"inputs" list'),
    ([1, 2], "JSON object"),
])
def test_malformed_requests_are_refused_with_the_reason(document, message):
    with pytest.raises(BadRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_request(orjson.dumps(document))


def test_binary_sizes_must_match_the_body():
    body, json_size = triton_request({"x": SAMPLES["FP32"]}, binary=True)
    with pytest.raises(BadRequest, match="runs past the end"):
        decode_request(body[:-1], json_size)
    with pytest.raises(BadRequest, match="belong to no input"):
        decode_request(body + b"\0", json_size)
    with pytest.raises(BadRequest, match="Inference-Header-Content-Length"):
        decode_request(body, len(body) + 1)


def test_unknown_requested_output_is_a_bad_request():
    request = InferRequest(inputs={}, outputs=[])
    request.outputs = decode_request(orjson.dumps({"inputs": [], "outputs": [{"name": "nope"}]})).outputs
    with pytest.raises(BadRequest, match="unknown output 'nope'"):
        encode_response(request, {"output0": np.zeros(1)})


def test_handler_answers_become_named_outputs():
    assert list(as_outputs(np.zeros(2))) == ["output0"]
    assert list(as_outputs([np.zeros(2), np.ones(1)])) == ["output0", "output1"]
    assert list(as_outputs({"logits": [1.0]})) == ["logits"]


def test_stream_frames_come_out_whole_however_the_stream_is_cut():
    answers = [(b'{"model_name":"m","outputs":[]}', None), (b'{"h":1}' + b"\x00\x01\x02", 7), (b"", None)]
    stream = b"".join(stream_frame(body, length) for body, length in answers)
    for size in (1, 3, 8, len(stream)):
        frames = StreamFrames()
        got = [frame for start in range(0, len(stream), size) for frame in frames.feed(stream[start:start + size])]
        assert got == [(body, len(body) if length is None else length) for body, length in answers], size
        assert frames.pending == 0
    cut = StreamFrames()
    assert cut.feed(stream[:-9]) == [(answers[0][0], len(answers[0][0]))]
    assert cut.pending > 0  # a stream cut in the middle of an answer
