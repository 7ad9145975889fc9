"""KServe's ``InferenceGRPCClient`` against a router, run as a process of its own (kserve's
generated stubs and tritonclient's define the same protobuf symbols: one process cannot import
both). Prints what it saw as JSON; ``test_kserve.py`` checks it.

    python kserve_client.py HOST:PORT MODEL < rows.json
"""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest


async def main(address: str, model: str, rows: np.ndarray) -> dict:
    seen: dict = {}
    async with InferenceGRPCClient(address, timeout=120) as client:
        seen["live"] = await client.is_server_live()
        seen["ready"] = await client.is_server_ready()
        seen["model_ready"] = await client.is_model_ready(model)
        typed = InferInput("input", list(rows.shape), "FP32", data=rows.reshape(-1).tolist())
        raw = InferInput("input", list(rows.shape), "FP32")
        raw.set_data_from_numpy(rows, binary_data=True)
        for kind, tensor in (("typed", typed), ("raw", raw)):
            response = await client.infer(InferRequest(model, [tensor], request_id=f"k-{kind}"))
            output = response.outputs[0]
            seen[kind] = {"id": response.id, "model": response.model_name, "name": output.name,
                          "data": output.as_numpy().tolist()}
        try:
            await client.infer(InferRequest("no-such-model", [raw]))
        except grpc.RpcError as error:
            seen["unknown"] = {"code": error.code().name, "details": error.details()}
    return seen


if __name__ == "__main__":
    features = np.asarray(json.loads(sys.stdin.read()), dtype=np.float32)
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], features))))
