"""gRPC inference messages ↔ the OIP's binary REST bodies: what a replica decodes from a gRPC
request is what the client sent, typed or raw, and its answers come back as raw contents."""

from __future__ import annotations

import numpy as np
import pytest

from modelplex.wire.oip import InferRequest, ProtocolError, RequestedOutput, decode_request, encode_response
from modelplex_router.grpc import messages
from modelplex_router.grpc.tensors import (FINAL, final_response, infer_response, parameters_of, request_body,
                                           set_parameters, wants_empty_final)

TYPED = {
    "BOOL": np.array([[True, False, True]]),
    "INT8": np.array([[-128, 127]], dtype=np.int8),
    "INT16": np.array([[-300]], dtype=np.int16),
    "INT32": np.array([[-(2**31)]], dtype=np.int32),
    "INT64": np.array([[2**50, -1]], dtype=np.int64),
    "UINT8": np.array([[0, 255]], dtype=np.uint8),
    "UINT16": np.array([[65535]], dtype=np.uint16),
    "UINT32": np.array([[2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[2**64 - 1]], dtype=np.uint64),
    "FP32": np.array([[0.25, -1.5]], dtype=np.float32),
    "FP64": np.array([[1e-300]], dtype=np.float64),
    "BYTES": np.array([[b"caf\xc3\xa9", b"\x00\xff"]], dtype=object),
}
FIELDS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
          "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
          "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def decoded(request) -> InferRequest:
    body, header_length = request_body(request)
    return decode_request(body, header_length)


def test_typed_contents_of_every_datatype_reach_the_replica_as_the_same_arrays():
    request = messages.ModelInferRequest(model_name="m", id="r-1")
    for datatype, array in TYPED.items():
        tensor = request.inputs.add(name=datatype.lower(), datatype=datatype, shape=array.shape)
        getattr(tensor.contents, FIELDS[datatype]).extend(array.reshape(-1).tolist())
    infer = decoded(request)
    assert infer.id == "r-1"
    assert list(infer.inputs) == [d.lower() for d in TYPED]
    for datatype, array in TYPED.items():
        got = infer[datatype.lower()]
        assert got.shape == array.shape and got.tolist() == array.tolist(), datatype
        assert got.dtype == array.dtype, datatype
    assert infer.binary_output  # answers come back binary: raw_output_contents


def test_raw_contents_go_as_they_are_with_parameters_and_requested_outputs():
    request = messages.ModelInferRequest(model_name="m")
    half = np.array([0.5, 1.5], dtype=np.float16)
    request.inputs.add(name="x", datatype="FP16", shape=[2]).parameters["scale"].double_param = 2.0
    request.raw_input_contents.append(half.tobytes())
    request.parameters["top_k"].int64_param = 3
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.outputs.add(name="y").parameters["classification"].int64_param = 2
    infer = decoded(request)
    assert infer["x"].dtype == np.float16 and infer["x"].tolist() == [0.5, 1.5]
    assert infer.parameters == {"top_k": 3, "binary_data_output": True}  # the stream's own flag stays here
    assert [(o.name, o.binary, o.parameters["classification"]) for o in infer.outputs] == [("y", True, 2)]
    assert wants_empty_final(request)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.raw_input_contents.append(b"\0" * 4), "raw_input_contents has 2 entries for 1 inputs"),
    (lambda r: r.inputs[0].contents.fp32_contents.append(1.0), "has contents although"),
])
def test_raw_and_typed_contents_do_not_mix(change, message):
    request = messages.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\0" * 4)
    change(request)
    with pytest.raises(ProtocolError, match=message):
        request_body(request)


def test_typed_contents_that_do_not_fit_are_refused_with_the_reason():
    request = messages.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 2]).contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(ProtocolError, match=r"inputs\[0\]: 2 values in fp32_contents for shape \[2, 2\]"):
        request_body(request)
    request = messages.ModelInferRequest(model_name="m")
    request.inputs.add(name="h", datatype="FP16", shape=[1])
    with pytest.raises(ProtocolError, match="'FP16' has no typed contents"):
        request_body(request)
    request = messages.ModelInferRequest(model_name="m")
    request.inputs.add(name="b", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    with pytest.raises(ProtocolError, match="out of range for INT8"):
        request_body(request)


def test_a_replica_answer_becomes_raw_output_contents_in_its_order():
    infer = InferRequest(inputs={}, id="r-2", outputs=[RequestedOutput("b", binary=False), RequestedOutput("a")],
                         binary_output=True, model_name="m", model_version="1")
    outputs = {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.array([b"x", b"yz"], dtype=object)}
    body, header_length = encode_response(infer, outputs, parameters={"sequence": 4})
    response = infer_response(body, header_length)
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r-2")
    assert parameters_of(response.parameters) == {"sequence": 4}
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("b", "BYTES", [2]), ("a", "INT32", [2, 3])]
    # "b" was asked for as JSON: it comes back raw all the same, as every output does over gRPC.
    assert response.raw_output_contents[0] == b"\x01\x00\x00\x00x\x02\x00\x00\x00yz"
    assert np.frombuffer(response.raw_output_contents[1], dtype="<i4").tolist() == list(range(6))


def test_parameters_of_every_kind_go_both_ways():
    response = messages.ModelInferResponse()
    values = {"flag": True, "count": -3, "huge": 2**63, "ratio": 0.5, "name": "x", "list": [1, 2]}
    set_parameters(response.parameters, values)
    assert response.parameters["huge"].WhichOneof("parameter_choice") == "uint64_param"
    assert parameters_of(response.parameters) == {**values, "list": "[1,2]"}


def test_the_final_marker_names_its_request():
    request = messages.ModelInferRequest(model_name="m", model_version="1", id="s-9")
    final = final_response(request)
    assert (final.model_name, final.model_version, final.id) == ("m", "1", "s-9")
    assert final.parameters[FINAL].bool_param is True
    assert not final.outputs
