"""gRPC inference messages ↔ the Open Inference Protocol's binary REST bodies (pure).

A ``ModelInferRequest`` becomes the body a REST client with binary tensors would send
(:mod:`modelplex.wire.oip`): every input as binary data (``raw_input_contents`` as they are,
typed ``contents`` packed), every output asked for as binary. The replica's binary answer becomes
a ``ModelInferResponse`` with ``raw_output_contents``, as Triton answers. So the replica, and
everything between, handles one protocol.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import orjson

from modelplex.wire.oip import DTYPES, ProtocolError, split_body, tensor_bytes
from modelplex_router.grpc import messages

#: A stream's request parameter (Triton's): send an empty final answer that marks the end.
EMPTY_FINAL = "triton_enable_empty_final_response"
#: Set on every answer of a stream (Triton's): whether it is the last one for its request.
FINAL = "triton_final_response"
#: Parameters that steer the gRPC exchange, never sent on to a handler.
_TRANSPORT_PARAMETERS = frozenset({EMPTY_FINAL})
_INT64_MAX = 2**63 - 1

#: The typed ``contents`` field of each datatype (FP16 has none: raw contents only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def parameters_of(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A map of ``InferParameter`` as plain values."""
    plain: dict[str, Any] = {}
    if not parameters:  # the common case, and a protobuf map's iteration is not free
        return plain
    for name, value in parameters.items():
        which = value.WhichOneof("parameter_choice")
        if which is not None:
            plain[name] = getattr(value, which)
    return plain


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a map of ``InferParameter`` from plain values (others as their JSON text)."""
    for name, value in values.items():
        parameter = target[name]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int) and -_INT64_MAX - 1 <= value <= _INT64_MAX:
            parameter.int64_param = value
        elif isinstance(value, int) and 0 <= value < 2**64:
            parameter.uint64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        elif isinstance(value, str):
            parameter.string_param = value
        else:
            parameter.string_param = orjson.dumps(value).decode()


# -- requests --------------------------------------------------------------------------------


def request_body(request: Any) -> tuple[bytes, int]:
    """(body, JSON header length) of the binary REST request that ``request`` stands for."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs")
    entries, blobs = [], []
    for index, tensor in enumerate(request.inputs):
        if raw and tensor.HasField("contents"):
            raise ProtocolError(f"inputs[{index}] has contents although the request sends raw_input_contents")
        blob = raw[index] if raw else _typed_bytes(tensor, f"inputs[{index}]")
        parameters = parameters_of(tensor.parameters)
        parameters["binary_data_size"] = len(blob)
        entries.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                        "parameters": parameters})
        blobs.append(blob)
    parameters = parameters_of(request.parameters)
    for name in _TRANSPORT_PARAMETERS.intersection(parameters):
        del parameters[name]
    parameters["binary_data_output"] = True
    document: dict[str, Any] = {"inputs": entries, "parameters": parameters}
    if request.id:
        document["id"] = request.id
    if request.outputs:
        document["outputs"] = [{"name": o.name, "parameters": {**parameters_of(o.parameters), "binary_data": True}}
                               for o in request.outputs]
    header = orjson.dumps(document)
    return b"".join([header, *blobs]), len(header)


def _typed_bytes(tensor: Any, where: str) -> bytes:
    """The raw bytes of an input sent as typed ``contents``."""
    datatype = tensor.datatype
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        known = ", ".join(CONTENTS_FIELD)
        raise ProtocolError(f"{where}: {datatype!r} has no typed contents (send raw_input_contents; "
                            f"typed contents are for {known})")
    values = list(getattr(tensor.contents, field))
    count = int(np.prod(tensor.shape, dtype=np.int64)) if len(tensor.shape) else 1
    if len(values) != count:
        raise ProtocolError(f"{where}: {len(values)} values in {field} for shape {list(tensor.shape)}")
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = values
    else:
        try:
            array = np.array(values, dtype=DTYPES[datatype])
        except OverflowError:
            raise ProtocolError(f"{where}: a value is out of range for {datatype}") from None
    return tensor_bytes(array, datatype)


# -- answers ---------------------------------------------------------------------------------


def infer_response(body: bytes, header_length: str | int | None) -> Any:
    """The ``ModelInferResponse`` of a replica's OIP answer (JSON, or JSON and binary tensors)."""
    header, tail = split_body(body, header_length)
    document = orjson.loads(header)
    response = messages.ModelInferResponse(model_name=document.get("model_name", ""),
                                           model_version=document.get("model_version") or "",
                                           id=document.get("id") or "")
    if document.get("parameters"):
        set_parameters(response.parameters, document["parameters"])
    offset = 0
    for entry in document.get("outputs", ()):
        output = response.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
        parameters = entry.get("parameters")
        size = None
        if parameters:
            parameters = dict(parameters)
            size = parameters.pop("binary_data_size", None)
            if parameters:
                set_parameters(output.parameters, parameters)
        if size is not None:
            blob = bytes(tail[offset:offset + size])
            offset += size
        else:  # an output the replica sent as JSON data
            blob = tensor_bytes(_json_array(entry), entry["datatype"])
        response.raw_output_contents.append(blob)
    return response


def _json_array(entry: Mapping[str, Any]) -> np.ndarray:
    data = entry.get("data", [])
    flat = data if isinstance(data, list) else [data]
    if entry["datatype"] == "BYTES":
        array = np.empty(len(flat), dtype=object)
        array[:] = [v.encode() if isinstance(v, str) else v for v in flat]
        return array
    return np.asarray(flat, dtype=DTYPES[entry["datatype"]])


def final_response(request: Any) -> Any:
    """The empty answer that ends a request's stream (with ``triton_enable_empty_final_response``)."""
    response = messages.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                           id=request.id)
    response.parameters[FINAL].bool_param = True
    return response


def wants_empty_final(request: Any) -> bool:
    """Whether a stream's request asked for the empty final answer."""
    return parameters_of(request.parameters).get(EMPTY_FINAL) is True
