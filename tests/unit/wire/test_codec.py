"""The call envelope keeps Python types across a handle call, and refuses what it cannot carry."""

import math

import numpy
import pytest
import torch

from modelplex.wire.codec import (Call, RemoteStreamError, decode_call, decode_value, encode_call, encode_stream_error,
                                  encode_stream_item, encode_value, from_plain)
from modelplex.wire.errors import BadRequest, HandlerError

VALUES = [
    "text", "", b"\x00\xffraw", None, 0, -7, 2**62, 1.5, True, False, [], {}, (), (1, "a", None),
    [(1, 2), (3, (4, 5))], {"a": (1,), "b": [b"x"]}, {1: "int key", (2, 3): "tuple key"},
    {"__mp__": "a user's key"}, {1, 2, 3}, frozenset({"x"}), [None, {"nested": [1.0, "two"]}],
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_arrive_with_their_types(value):
    decoded = decode_value(encode_value(value))
    assert decoded == value
    assert type(decoded) is type(value)


def test_nested_tuples_stay_tuples():
    decoded = decode_value(encode_value({"pairs": [(1, (2, 3))]}))
    assert type(decoded["pairs"][0]) is tuple and type(decoded["pairs"][0][1]) is tuple


def test_non_finite_floats_survive():
    decoded = decode_value(encode_value([math.inf, -math.inf, math.nan]))
    assert decoded[:2] == [math.inf, -math.inf] and math.isnan(decoded[2])


def test_bytearray_and_memoryview_arrive_as_bytes():
    assert decode_value(encode_value(bytearray(b"ab"))) == b"ab"
    assert decode_value(encode_value(memoryview(b"cd"))) == b"cd"


def test_numpy_arrays_keep_dtype_shape_and_values():
    array = numpy.arange(12, dtype=numpy.int16).reshape(3, 4)[:, 1:]  # not contiguous
    decoded = decode_value(encode_value(array))
    assert decoded.dtype == numpy.int16 and decoded.shape == (3, 3)
    assert (decoded == array).all()
    assert decode_value(encode_value(numpy.float32(2.5))) == 2.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_tensors_arrive_as_tensors_where_torch_is_loaded(dtype):
    tensor = (torch.arange(6).reshape(2, 3) % 2).to(dtype)
    decoded = decode_value(encode_value(tensor))
    assert isinstance(decoded, torch.Tensor)
    assert decoded.dtype == dtype and decoded.shape == (2, 3)
    assert torch.equal(decoded, tensor)


def test_objects_that_cannot_travel_are_a_type_error_naming_their_type():
    class Opaque:
        pass

    with pytest.raises(TypeError, match="Opaque cannot travel"):
        encode_value({"x": Opaque()})


def test_a_call_round_trips_method_arguments_and_stream_flag():
    call = decode_call(encode_call(Call("run", ("hi", b"raw", None, (1, 2)), {"key": ("a",)}, stream=True)))
    assert call == Call("run", ("hi", b"raw", None, (1, 2)), {"key": ("a",)}, stream=True)


@pytest.mark.parametrize("body", [b"not json", b"{}", b'{"method": 3}', b'{"method": "m", "args": {}}'])
def test_a_malformed_envelope_is_a_bad_request(body):
    with pytest.raises(BadRequest, match="malformed call envelope"):
        decode_call(body)


def test_a_stream_error_record_is_never_data():
    record = from_plain(__import__("orjson").loads(encode_stream_error(HandlerError.of(ValueError("late")))))
    assert isinstance(record, RemoteStreamError)
    assert (record.code, record.type, record.message) == ("handler_error", "ValueError", "ValueError: late")
    # Data shaped like an error record stays data.
    looks_like = {"error": {"code": "x", "message": "y"}}
    assert decode_value(encode_stream_item(looks_like)) == looks_like
