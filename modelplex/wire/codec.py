"""The call envelope: what a handle sends and gets back, with Python types kept.

A handle call is one HTTP request through the router. Its body (content type
:data:`CALL_CONTENT_TYPE`) is JSON ``{"method": name, "args": [...], "kwargs": {...},
"stream": bool}``; the answer is one value (:data:`VALUE_CONTENT_TYPE`) or, for a stream, one
value per line (:data:`STREAM_CONTENT_TYPE`). Values are JSON with tags for what JSON lacks,
so a handler receives what the caller passed:

========================  ==========================================================
``str`` ``int`` ``bool``  as JSON (``float`` too; NaN and ±inf are tagged)
``None``                  ``null``
``list``, ``dict``        as JSON when the keys are strings; other keys are tagged
``tuple``                 tagged: arrives as a tuple, nested ones too
``bytes``                 tagged, base64 (``bytearray`` and ``memoryview`` arrive as ``bytes``)
``set``, ``frozenset``    tagged
numpy arrays              tagged: dtype, shape and the raw buffer (base64)
torch tensors             tagged like arrays, rebuilt as tensors where torch is loaded
                          (the replica), as numpy arrays elsewhere; on the CPU
========================  ==========================================================

Anything else (an arbitrary object) is refused with a ``TypeError`` naming its type: no
pickle crosses the network. A tag is a one-key object ``{"__mp__": [kind, payload]}``; a
user's dict that has the key ``__mp__`` is itself tagged, so no data is ever misread.
A stream that fails ends with a tagged error record, then the connection is cut.
"""

from __future__ import annotations

import base64
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import orjson

from modelplex.wire.errors import BadRequest, ModelplexError

CALL_CONTENT_TYPE = "application/x-modelplex-call"
VALUE_CONTENT_TYPE = "application/x-modelplex-value"
STREAM_CONTENT_TYPE = "application/x-modelplex-stream"

_TAG = "__mp__"


@dataclass
class Call:
    """One handle call: ``method(*args, **kwargs)``, streamed or not."""

    method: str = "__call__"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    stream: bool = False


# -- values -------------------------------------------------------------------------------------


def to_plain(value: Any) -> Any:
    """``value`` as plain JSON data, tagged where JSON would lose its type."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else {_TAG: ["float", repr(value)]}
    if kind is list:
        return [to_plain(item) for item in value]
    if kind is dict:
        if _TAG not in value and all(type(key) is str for key in value):
            return {key: to_plain(item) for key, item in value.items()}
        return {_TAG: ["dict", [[to_plain(key), to_plain(item)] for key, item in value.items()]]}
    if kind is tuple:
        return {_TAG: ["tuple", [to_plain(item) for item in value]]}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_TAG: ["bytes", base64.b64encode(value).decode()]}
    if isinstance(value, (set, frozenset)):
        return {_TAG: [kind.__name__ if kind in (set, frozenset) else "set", [to_plain(item) for item in value]]}
    module = kind.__module__
    if module == "torch" and hasattr(value, "detach"):
        return {_TAG: ["tensor", _array_payload(_tensor_to_numpy(value), str(value.dtype).removeprefix("torch."))]}
    if module == "numpy":
        if hasattr(value, "shape") and hasattr(value, "tobytes") and getattr(value, "ndim", 0) > 0:
            return {_TAG: ["ndarray", _array_payload(value, str(value.dtype))]}
        if hasattr(value, "item"):  # a numpy scalar
            return to_plain(value.item())
    # Subclasses of the plain types (an IntEnum, a str subclass) travel as their base type.
    bases: tuple[type[Any], ...] = (bool, int, float, str, list, dict, tuple)
    for base in bases:
        if isinstance(value, base):
            return to_plain(base(value))
    raise TypeError(f"a {kind.__module__}.{kind.__qualname__} cannot travel through a handle: send str, bytes, "
                    "numbers, None, lists, tuples, dicts, sets, numpy arrays or torch tensors")


def from_plain(data: Any) -> Any:
    """The inverse of :func:`to_plain`."""
    if type(data) is list:
        return [from_plain(item) for item in data]
    if type(data) is not dict:
        return data
    if len(data) != 1 or _TAG not in data:
        return {key: from_plain(item) for key, item in data.items()}
    kind, payload = data[_TAG]
    if kind == "tuple":
        return tuple(from_plain(item) for item in payload)
    if kind == "bytes":
        return base64.b64decode(payload)
    if kind == "dict":
        return {_hashable(from_plain(key)): from_plain(item) for key, item in payload}
    if kind == "set":
        return {_hashable(from_plain(item)) for item in payload}
    if kind == "frozenset":
        return frozenset(_hashable(from_plain(item)) for item in payload)
    if kind == "float":
        return float(payload)
    if kind == "ndarray":
        return _numpy_from(payload)
    if kind == "tensor":
        return _tensor_from(payload)
    if kind == "error":
        return RemoteStreamError(payload)
    raise ValueError(f"unknown value tag {kind!r}")


def _hashable(value: Any) -> Any:
    return tuple(_hashable(item) for item in value) if isinstance(value, list) else value


def _array_payload(array: Any, dtype: str) -> dict[str, Any]:
    import numpy

    contiguous = numpy.ascontiguousarray(array)
    return {"dtype": dtype, "shape": list(contiguous.shape), "data": base64.b64encode(contiguous.tobytes()).decode()}


def _tensor_to_numpy(tensor: Any) -> Any:
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16: widen, and narrow back on arrival
        tensor = tensor.float()
    return tensor.numpy()


def _numpy_from(payload: dict[str, Any]) -> Any:
    import numpy

    array = numpy.frombuffer(base64.b64decode(payload["data"]), dtype=payload["dtype"])
    return array.reshape(payload["shape"]).copy()  # writable, owns its memory


def _tensor_from(payload: dict[str, Any]) -> Any:
    dtype = payload["dtype"]
    array_dtype = "float32" if dtype == "bfloat16" else dtype
    array = _numpy_from({**payload, "dtype": array_dtype})
    torch = sys.modules.get("torch")  # never imported here: a client without torch gets an array
    if torch is None:
        return array
    return torch.from_numpy(array).to(getattr(torch, dtype))


def encode_value(value: Any) -> bytes:
    """One value, as the body of a :data:`VALUE_CONTENT_TYPE` answer."""
    return orjson.dumps(to_plain(value))


def decode_value(data: bytes) -> Any:
    return from_plain(orjson.loads(data))


# -- calls ----------------------------------------------------------------------------------------


def encode_call(call: Call) -> bytes:
    return orjson.dumps({
        "method": call.method,
        "args": [to_plain(arg) for arg in call.args],
        "kwargs": {key: to_plain(value) for key, value in call.kwargs.items()},
        "stream": call.stream,
    })


def decode_call(data: bytes) -> Call:
    """A call from a request body; a malformed one is a :class:`BadRequest`."""
    try:
        document = orjson.loads(data)
        method, args, kwargs = document["method"], document.get("args", []), document.get("kwargs", {})
        if not isinstance(method, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            raise TypeError("method must be a string, args a list, kwargs an object")
        return Call(method, tuple(from_plain(arg) for arg in args),
                    {key: from_plain(value) for key, value in kwargs.items()}, bool(document.get("stream", False)))
    except (ValueError, KeyError, TypeError) as error:
        raise BadRequest(f"malformed call envelope: {error}") from None


# -- streams ---------------------------------------------------------------------------------------


def encode_stream_item(value: Any) -> bytes:
    return orjson.dumps(to_plain(value)) + b"\n"


def encode_stream_error(error: ModelplexError) -> bytes:
    """The record that ends a failed stream (the connection is cut after it)."""
    payload = error.to_dict()["error"]
    return orjson.dumps({_TAG: ["error", payload]}) + b"\n"


class RemoteStreamError:
    """A decoded error record: the producer failed after sending part of the stream."""

    def __init__(self, payload: dict[str, Any]):
        self.code = payload.get("code")
        self.message = payload.get("message", "")
        self.type = payload.get("type")
        self.module = payload.get("module")
