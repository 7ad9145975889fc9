"""The built-in handler checks OIP inputs against the model's metadata, as Triton does, and ids
cannot re-target the router's calls to a replica. Real tritonclient against the zoo stack."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

ROWS = np.linspace(-1, 1, 2 * 16, dtype=np.float32).reshape(2, 16)


def client_for(url: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=60.0, connection_timeout=60.0)


def infer_error(client: triton.InferenceServerClient, model: str, tensors: list) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        client.infer(model, tensors)
    assert raised.value.status() == "400", raised.value
    return raised.value


def test_tritonclient_a_wrong_datatype_is_a_400_naming_the_input_and_both_types(zoo):
    client = client_for(zoo.router_url)
    try:
        wide = ROWS.astype(np.float64)
        tensor = triton.InferInput("input", list(wide.shape), "FP64")
        tensor.set_data_from_numpy(wide)
        message = str(infer_error(client, "mlp-a", [tensor]))
        assert "'input'" in message and "FP32" in message and "FP64" in message
        declared = triton.InferInput("features", [2, 16], "INT32")
        declared.set_data_from_numpy(ROWS.astype(np.int32))
        message = str(infer_error(client, "declared", [declared]))
        assert "'features'" in message and "FP32" in message and "INT32" in message
    finally:
        client.close()


def test_tritonclient_an_unknown_input_name_is_a_400_naming_it(zoo):
    client = client_for(zoo.router_url)
    try:
        tensor = triton.InferInput("nonsense", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        message = str(infer_error(client, "mlp-a", [tensor]))
        assert "unknown input 'nonsense'" in message and "'input'" in message
        good = triton.InferInput("input", list(ROWS.shape), "FP32")
        good.set_data_from_numpy(ROWS)
        assert client.infer("mlp-a", [good]).as_numpy("output0").shape == (2, 4)  # the right name still works
    finally:
        client.close()


@pytest.mark.parametrize("model", ["%2E%2E", "%2e%2e", "..%2Fv1", "a%2F..%2F..", "%252e%252e"])
def test_an_id_cannot_retarget_the_routers_call_to_a_replica(zoo, model):
    request = urllib.request.Request(f"{zoo.router_url}/v2/repository/models/{model}/load", data=b"{}",
                                     method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400
    assert "segment" in json.loads(refused.value.read())["error"]  # OIP's error form: {"error": "..."}
