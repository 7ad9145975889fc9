"""KServe's v2 gRPC client (``InferenceGRPCClient``) against the router: health, model
readiness, and inference with typed and raw contents equal to the REST path's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as triton_http

ROWS = np.linspace(-2, 2, 2 * 16, dtype=np.float32).reshape(2, 16)
CLIENT = Path(__file__).resolve().parent / "kserve_client.py"


def test_kserve_grpc_client_health_and_typed_and_raw_infer_match_the_rest_path(stack):
    run = subprocess.run([sys.executable, str(CLIENT), stack.grpc["zoo"], "mlp-b"], input=json.dumps(ROWS.tolist()),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["live"] is True and seen["ready"] is True and seen["model_ready"] is True
    rest = triton_http.InferenceServerClient(stack.url("zoo").removeprefix("http://"), network_timeout=120.0)
    try:
        tensor = triton_http.InferInput("input", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        expected = rest.infer("mlp-b", [tensor]).as_numpy("output0")
    finally:
        rest.close()
    for kind in ("typed", "raw"):
        answer = seen[kind]
        assert (answer["id"], answer["model"], answer["name"]) == (f"k-{kind}", "mlp-b", "output0")
        np.testing.assert_allclose(np.asarray(answer["data"], dtype=np.float32), expected, rtol=1e-6, atol=1e-6)
    assert seen["unknown"]["code"] == "NOT_FOUND" and "no-such-model" in seen["unknown"]["details"]
