"""Open Inference Protocol v2 (KServe v2, Triton's HTTP API) tensors: the pure codec.

Decodes inference requests and encodes responses in both of the protocol's bodies:

- JSON: ``{"id", "parameters", "inputs": [{"name", "shape", "datatype", "data"}], "outputs"}``;
- the binary tensor extension (what ``tritonclient`` sends by default): the JSON header is
  followed by each tensor's raw bytes, its length in ``Inference-Header-Content-Length`` and
  each binary tensor's size in ``parameters.binary_data_size``.

Tensors are numpy arrays (BYTES: object arrays of ``bytes``). The router and the replica both
use this module; it imports numpy, never torch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import orjson

from modelplex.wire.errors import BadRequest

#: The binary tensor extension's header: the length of the JSON part of the body.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: Router → replica: this /v1/invoke body is an OIP inference request.
PROTOCOL_HEADER = "X-Modelplex-Protocol"
PROTOCOL = "oip-v2"
#: Router → replica: the OIP model version asked for (``/versions/V``), if any.
VERSION_HEADER = "X-Modelplex-Model-Version"

#: Router → replica (``Accept``): a streaming handler's chunks as OIP answers, one per frame
#: (:func:`stream_frame`); the router's gRPC ``ModelStreamInfer`` asks for it.
STREAM_CONTENT_TYPE = "application/x-modelplex-oip-stream"
_FRAME_HEAD = struct.Struct("<II")

#: OIP datatype → numpy dtype (little-endian, as the binary extension requires).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
DATATYPES = tuple(DTYPES)
_KIND_TO_DATATYPE = {np.dtype(d).newbyteorder("="): name for name, d in DTYPES.items() if name != "BYTES"}


class ProtocolError(BadRequest):
    """A body that is not a valid OIP inference request (400)."""


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype of ``array``; strings and bytes are BYTES."""
    dtype = array.dtype
    if dtype.kind in "OSU":
        return "BYTES"
    name = _KIND_TO_DATATYPE.get(dtype.newbyteorder("="))
    if name is None:
        raise ValueError(f"no Open Inference Protocol datatype for numpy {dtype}")
    return name


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: the request's default
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    """One decoded inference request, as a handler gets it.

    ``inputs`` keeps the request's order (a model that takes positional tensors gets them in
    that order); ``outputs`` lists the outputs asked for (None: every output).
    """

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[RequestedOutput] | None = None
    binary_output: bool = False  # ``parameters.binary_data_output``: every output binary
    model_name: str = ""
    model_version: str | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.inputs[name]

    @property
    def tensors(self) -> list[np.ndarray]:
        """The input tensors, in the request's order."""
        return list(self.inputs.values())


# -- requests --------------------------------------------------------------------------------


def split_body(body: bytes, header_length: str | int | None) -> tuple[bytes, memoryview]:
    """(JSON header, binary tail) of a body, ``header_length`` from ``Inference-Header-Content-Length``."""
    if header_length is None or header_length == "":
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except (TypeError, ValueError):
        raise ProtocolError(f"{HEADER_LENGTH} must be an integer (got {header_length!r})") from None
    if not 0 <= length <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} is {length} but the body has {len(body)} bytes")
    view = memoryview(body)
    return bytes(view[:length]), view[length:]


def parse_header(data: bytes) -> dict[str, Any]:
    """The JSON part of a request: an object with an ``inputs`` list (400 otherwise)."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise ProtocolError(f"the body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ProtocolError("an inference request is a JSON object")
    if not isinstance(document.get("inputs"), list):
        raise ProtocolError('an inference request needs an "inputs" list')
    return document


def decode_request(body: bytes, header_length: str | int | None = None) -> InferRequest:
    """Decode an inference request body (JSON, or JSON + binary tensors)."""
    header, tail = split_body(body, header_length)
    document = parse_header(header)
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError('"id" must be a string')
    parameters = _parameters(document.get("parameters"), "parameters")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for index, spec in enumerate(document["inputs"]):
        where = f"inputs[{index}]"
        if not isinstance(spec, dict):
            raise ProtocolError(f"{where} must be an object")
        name, datatype, shape = _tensor_header(spec, where)
        if name in inputs:
            raise ProtocolError(f"{where}: input {name!r} appears twice")
        tensor_parameters = _parameters(spec.get("parameters"), f"{where}.parameters")
        size = tensor_parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError(f"{where}.parameters.binary_data_size must be a non-negative integer")
            if offset + size > len(tail):
                raise ProtocolError(f"{where}: binary_data_size {size} runs past the end of the body")
            inputs[name] = _from_binary(tail[offset:offset + size], datatype, shape, where)
            offset += size
        elif "data" in spec:
            inputs[name] = _from_json(spec["data"], datatype, shape, where)
        else:
            raise ProtocolError(f'{where} needs "data" or parameters.binary_data_size')
    if offset != len(tail):
        raise ProtocolError(f"{len(tail) - offset} bytes of binary data belong to no input")
    outputs = None
    if document.get("outputs") is not None:
        if not isinstance(document["outputs"], list):
            raise ProtocolError('"outputs" must be a list')
        outputs = []
        for index, spec in enumerate(document["outputs"]):
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise ProtocolError(f'outputs[{index}] must be an object with a "name"')
            out_parameters = _parameters(spec.get("parameters"), f"outputs[{index}].parameters")
            binary = out_parameters.get("binary_data")
            outputs.append(RequestedOutput(spec["name"], binary if isinstance(binary, bool) else None,
                                           out_parameters))
    return InferRequest(inputs=inputs, id=request_id, parameters=parameters, outputs=outputs,
                        binary_output=parameters.get("binary_data_output") is True)


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"{where} must be an object")
    return value


def _tensor_header(spec: dict[str, Any], where: str) -> tuple[str, str, tuple[int, ...]]:
    name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f'{where} needs a "name" string')
    if datatype not in DTYPES:
        raise ProtocolError(f"{where}.datatype must be one of {', '.join(DATATYPES)} (got {datatype!r})")
    if (not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise ProtocolError(f"{where}.shape must be a list of non-negative integers (got {shape!r})")
    return name, datatype, tuple(shape)


def _count(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _from_binary(data: memoryview, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    count = _count(shape)
    if datatype == "BYTES":
        items, position = [], 0
        while position < len(data):
            if position + 4 > len(data):
                raise ProtocolError(f"{where}: truncated BYTES element length")
            length = int.from_bytes(data[position:position + 4], "little")
            position += 4
            if position + length > len(data):
                raise ProtocolError(f"{where}: truncated BYTES element")
            items.append(bytes(data[position:position + length]))
            position += length
        if len(items) != count:
            raise ProtocolError(f"{where}: {len(items)} BYTES elements for shape {list(shape)}")
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = DTYPES[datatype]
    if len(data) != count * dtype.itemsize:
        raise ProtocolError(f"{where}: {len(data)} bytes of {datatype} do not fill shape {list(shape)}")
    # A copy: the handler may keep or change it, and the body's buffer is freed with the request.
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _from_json(data: Any, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    flat = _flatten(data) if isinstance(data, list) else [data]
    if len(flat) != _count(shape):
        raise ProtocolError(f"{where}: {len(flat)} values for shape {list(shape)}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise ProtocolError(f"{where}: BYTES data must be strings")
        array = np.empty(len(flat), dtype=object)
        array[:] = [v.encode() for v in flat]
        return array.reshape(shape)
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise ProtocolError(f"{where}: BOOL data must be true or false")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise ProtocolError(f"{where}: {datatype} data must be numbers")
    dtype = DTYPES[datatype]
    if dtype.kind in "iu":
        if not all(isinstance(v, int) for v in flat):
            raise ProtocolError(f"{where}: {datatype} data must be integers")
        limits = np.iinfo(dtype)
        if flat and (min(flat) < limits.min or max(flat) > limits.max):
            raise ProtocolError(f"{where}: a value is out of range for {datatype}")
    try:
        return np.array(flat, dtype=dtype).reshape(shape)
    except (OverflowError, TypeError, ValueError):
        raise ProtocolError(f"{where}: the data does not fit {datatype}") from None


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major values of a flat or nested JSON list (OIP accepts both)."""
    if not any(isinstance(v, list) for v in data):
        return data
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


# -- responses -------------------------------------------------------------------------------


def as_outputs(result: Any, default_names: Iterable[str] = ()) -> dict[str, np.ndarray]:
    """A handler's answer as named arrays: a mapping of name → array, one array, or a list of
    arrays (named after ``default_names``, else ``output0``, ``output1``, ...)."""
    if isinstance(result, InferResponse):
        return result.outputs
    if isinstance(result, Mapping):
        return {str(k): _as_array(v) for k, v in result.items()}
    arrays = list(result) if isinstance(result, (list, tuple)) else [result]
    names = list(default_names)
    names += [f"output{i}" for i in range(len(names), len(arrays))]
    return {names[i]: _as_array(a) for i, a in enumerate(arrays)}


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy"):  # a CPU tensor, without importing torch here
        return np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value.numpy())
    return np.asarray(value)


@dataclass
class InferResponse:
    """What a handler may return for full control over the answer (else arrays will do)."""

    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)


def encode_response(request: InferRequest, outputs: Mapping[str, np.ndarray], *,
                    parameters: Mapping[str, Any] | None = None) -> tuple[bytes, int | None]:
    """(body, JSON header length or None) of the answer to ``request``.

    Only the outputs the request asked for are sent (all of them when it named none); each one
    goes as binary when its ``binary_data`` (or the request's ``binary_data_output``) says so.
    """
    if request.outputs is not None:
        wanted = []
        for requested in request.outputs:
            if requested.name not in outputs:
                raise BadRequest(f"unknown output {requested.name!r}; the model has "
                                 f"{', '.join(map(repr, outputs)) or 'none'}")
            binary = requested.binary if requested.binary is not None else request.binary_output
            wanted.append((requested.name, binary))
    else:
        wanted = [(name, request.binary_output) for name in outputs]
    entries, blobs = [], []
    for name, binary in wanted:
        array = outputs[name]
        datatype = datatype_of(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            blob = tensor_bytes(array, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _to_json_data(array, datatype)
        entries.append(entry)
    document: dict[str, Any] = {"model_name": request.model_name}
    if request.model_version is not None:
        document["model_version"] = request.model_version
    if request.id is not None:
        document["id"] = request.id
    if parameters:
        document["parameters"] = dict(parameters)
    document["outputs"] = entries
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def tensor_bytes(array: np.ndarray, datatype: str) -> bytes:
    """A tensor's bytes in the binary extension's (and gRPC's raw contents') layout: little-endian
    values, or each BYTES element after its 4-byte little-endian length."""
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode()
            parts += [len(data).to_bytes(4, "little"), data]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=DTYPES[datatype]).tobytes()


def _to_json_data(array: np.ndarray, datatype: str) -> Any:
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [item.decode(errors="replace") if isinstance(item, bytes) else str(item) for item in flat]
    if datatype == "FP16":
        flat = flat.astype(np.float32)  # orjson writes float16 arrays only via float32
    return np.ascontiguousarray(flat)


def error_body(message: str) -> bytes:
    """An OIP error object: ``{"error": "<message>"}``."""
    return orjson.dumps({"error": message})


def tensor_metadata(name: str, datatype: str, shape: Iterable[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [int(d) for d in shape]}


# -- streams ---------------------------------------------------------------------------------


def stream_frame(body: bytes, header_length: int | None = None) -> bytes:
    """One answer of a :data:`STREAM_CONTENT_TYPE` stream: the body's length and its JSON
    header's (4-byte little-endian each), then the body (an answer from
    :func:`encode_response`, or a JSON ``{"error": {...}}`` that ends the stream)."""
    return _FRAME_HEAD.pack(len(body), len(body) if header_length is None else header_length) + body


class StreamFrames:
    """Splits a :data:`STREAM_CONTENT_TYPE` stream, fed as its chunks come, into its frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[bytes, int]]:
        """The frames (body, JSON header length) that ``chunk`` completes."""
        self._buffer += chunk
        frames = []
        while len(self._buffer) >= _FRAME_HEAD.size:
            length, header_length = _FRAME_HEAD.unpack_from(self._buffer)
            end = _FRAME_HEAD.size + length
            if len(self._buffer) < end:
                break
            frames.append((bytes(self._buffer[_FRAME_HEAD.size:end]), header_length))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of a frame not complete yet (a stream that ends with some was cut)."""
        return len(self._buffer)
