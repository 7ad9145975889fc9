"""Access over gRPC is the REST request's: model control off by default (PERMISSION_DENIED), and
with router auth a bearer token in the call's metadata (UNAUTHENTICATED without a valid one,
PERMISSION_DENIED for a model the client may not call); health stays open."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

WAIT_S = 120.0


def ones() -> triton.InferInput:
    tensor = triton.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    return tensor


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_model_control_is_off_unless_the_spec_turns_it_on(stack):
    with triton.InferenceServerClient(stack.grpc["echo"]) as echo:
        for call in (lambda: echo.load_model("any"), lambda: echo.unload_model("any")):
            with pytest.raises(InferenceServerException) as raised:
                call()
            assert raised.value.status() == "StatusCode.PERMISSION_DENIED"
            assert "spec.router.modelControl" in raised.value.message()


def test_router_auth_takes_the_bearer_token_from_the_call_s_metadata(stack, tokens):
    with triton.InferenceServerClient(stack.grpc["guarded"]) as guarded:
        for headers in (None, {"authorization": "Bearer not-a-token"}):
            with pytest.raises(InferenceServerException) as raised:
                guarded.infer("m-1", [ones()], headers=headers, client_timeout=WAIT_S)
            assert raised.value.status() == "StatusCode.UNAUTHENTICATED"
        result = guarded.infer("m-1", [ones()], headers=bearer(tokens["alice"]), client_timeout=WAIT_S)
        assert result.as_numpy("total").tolist() == [2.0]
        assert guarded.infer("public-1", [ones()], headers=bearer(tokens["bob"]), client_timeout=WAIT_S)
        with pytest.raises(InferenceServerException) as raised:
            guarded.infer("m-1", [ones()], headers=bearer(tokens["bob"]), client_timeout=WAIT_S)
        assert raised.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "'bob' may not call model 'm-1'" in raised.value.message()
        with pytest.raises(InferenceServerException) as raised:
            guarded.get_model_metadata("m-1")
        assert raised.value.status() == "StatusCode.UNAUTHENTICATED"
        assert guarded.is_server_live()  # open, as /v2/health/live is
    with grpc.insecure_channel(stack.grpc["guarded"]) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=WAIT_S)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
