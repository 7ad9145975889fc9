"""Handlers for the Gateway tests, written as users write them (copied beside the manifest).

``Models`` holds up to ten small torch models per replica (a linear layer each, its weights
seeded by the model id) and answers which replica it is (``TEST_REPLICA``) and how many times
that replica has loaded the model, so a test can tell whether a request found its model loaded;
a raw body is answered with its length and digest, an OIP request with its tensors echoed.
A body ``{"steps": n}`` is answered as a stream of ``n`` computed chunks (``"pause"``: seconds
before each).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import zlib
from collections import Counter

import numpy as np
import torch
from torch import nn

from modelplex import get_multiplexed_model_id, multiplexed
from modelplex.wire.oip import InferRequest

LOADS: Counter[str] = Counter()


class Models:
    @multiplexed(max_num_models_per_replica=10)
    async def load_model(self, model_id: str) -> nn.Module:
        torch.manual_seed(zlib.crc32(model_id.encode()))
        LOADS[model_id] += 1
        return nn.Linear(16, 4).eval()

    async def __call__(self, body):
        model_id = get_multiplexed_model_id()
        model = await self.load_model(model_id)
        if isinstance(body, InferRequest):
            return {f"{name}_echo": array for name, array in body.inputs.items()}
        if isinstance(body, dict) and "steps" in body:
            return self._steps(model, int(body["steps"]), float(body.get("pause", 0)))
        answer = {"model": model_id, "replica": os.environ.get("TEST_REPLICA"), "loads": LOADS[model_id]}
        if isinstance(body, (bytes, bytearray)):
            return {**answer, "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        with torch.no_grad():
            scores = model(torch.tensor(np.asarray(body.get("x", [0.0] * 16), dtype=np.float32)))
        return {**answer, "scores": scores.tolist()}

    async def _steps(self, model: nn.Module, count: int, pause: float):
        for step in range(count):
            await asyncio.sleep(pause)
            with torch.no_grad():
                total = float(model(torch.full((16,), float(step))).sum())
            yield {"step": step, "total": total}
