"""KServe's ``InferenceRESTClient`` against a router, run as a process of its own: importing
``kserve`` registers its generated gRPC stubs, whose protobuf symbols clash with tritonclient's
gRPC stubs, which the gRPC tests import in the test process. Prints what it saw as JSON;
``test_clients.py`` checks it.

    python kserve_rest_client.py ROUTER_URL MODEL < rows.json
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(url: str, model: str, rows: np.ndarray) -> dict:
    seen: dict = {}
    async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=60, retries=0)) as client:
        seen["live"] = await client.is_server_live(url)
        seen["ready"] = await client.is_server_ready(url)
        seen["model_ready"] = await client.is_model_ready(url, model)
        for binary in (False, True):
            tensor = InferInput("input", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows, binary_data=binary)
            response = await client.infer(url, InferRequest(model, [tensor], request_id="k-1"), model_name=model)
            output = response.outputs[0]
            seen["binary" if binary else "json"] = {"id": response.id, "model": response.model_name,
                                                    "name": output.name, "data": output.as_numpy().tolist()}
        seen["nobody_ready"] = await client.is_model_ready(url, "nobody")
        tensor = InferInput("input", [1, rows.shape[1]], "FP32", data=[0.0] * rows.shape[1])
        try:
            await client.infer(url, InferRequest("nobody", [tensor]), model_name="nobody")
        except httpx.HTTPStatusError as error:
            seen["nobody"] = {"status": error.response.status_code, "body": error.response.json()}
    return seen


if __name__ == "__main__":
    features = np.asarray(json.loads(sys.stdin.read()), dtype=np.float32)
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], features))))
