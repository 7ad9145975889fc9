"""``x-modelplex-on-cold`` over gRPC is the REST header's (the ``zoo``'s real TorchScript models): in
the call's metadata, ``reject`` ends a
call for a model no replica holds with UNAVAILABLE at once (the REST 503 ``model_not_loaded``)
and starts its load, so a later call finds it; a bad value is INVALID_ARGUMENT naming the key."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

WAIT_S = 120.0
REJECT = {"x-modelplex-on-cold": "reject"}


def features() -> triton.InferInput:
    tensor = triton.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    return tensor


def test_a_call_that_will_not_wait_for_a_load_is_unavailable_at_once_and_the_load_starts(stack):
    with triton.InferenceServerClient(stack.grpc["zoo"]) as zoo:
        zoo.unload_model("mlp-b")  # whatever other tests loaded: no replica holds it now
        with pytest.raises(InferenceServerException) as raised:
            zoo.infer("mlp-b", [features()], headers=REJECT, client_timeout=WAIT_S)
        assert raised.value.status() == "StatusCode.UNAVAILABLE"
        assert "x-modelplex-on-cold: reject" in raised.value.message()
        deadline = time.monotonic() + WAIT_S
        while True:  # the background load lands; the router sees it within its poll interval
            try:
                result = zoo.infer("mlp-b", [features()], headers=REJECT, client_timeout=WAIT_S)
                break
            except InferenceServerException as error:
                assert error.status() == "StatusCode.UNAVAILABLE" and time.monotonic() < deadline, error
                time.sleep(0.2)
        assert result.as_numpy("output0").shape == (1, 4)
        with pytest.raises(InferenceServerException) as raised:
            zoo.infer("mlp-b", [features()], headers={"x-modelplex-on-cold": "maybe"}, client_timeout=WAIT_S)
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "x-modelplex-on-cold" in raised.value.message()
