"""A handler written with the SDK: the zoo's MLPs, multiplexed and batched.

Serve it with ``custom.yaml`` beside this file (``handler: "mlp_handler:MLPHandler"``).
"""

import asyncio
import os
from pathlib import Path

import torch

from modelplex import batch, get_multiplexed_model_id, multiplexed, safe_join
from modelplex.wire.errors import ModelNotFound

MODELS = Path(__file__).resolve().parent / "models"


class MLPHandler:
    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> torch.jit.ScriptModule:
        # A real handler would download from a blob store here; the zoo is on local disk.
        # safe_join keeps every id inside MODELS (400 for "../x"); a missing file is a 404
        # that names the id, not the server's path.
        path = safe_join(MODELS, model_id, ".pt")
        if not os.path.isfile(path):
            raise ModelNotFound(f"no model {model_id!r} in the zoo")
        return await asyncio.to_thread(torch.jit.load, path)

    @batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def __call__(self, requests: list[dict]) -> list[dict]:
        model = await self.load_model(get_multiplexed_model_id())
        inputs = torch.tensor([request["inputs"] for request in requests], dtype=torch.float32)
        with torch.inference_mode():
            outputs = await asyncio.to_thread(model, inputs)
        return [{"outputs": row} for row in outputs.tolist()]
