"""A handler written with the SDK: the zoo's MLPs, multiplexed and batched.

Serve it with ``custom.yaml`` beside this file (``handler: "mlp_handler:MLPHandler"``).
"""

import asyncio
from pathlib import Path

import torch

from modelplex import batch, get_multiplexed_model_id, multiplexed

MODELS = Path(__file__).resolve().parent / "models"


class MLPHandler:
    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> torch.jit.ScriptModule:
        # A real handler would download from a blob store here; the zoo is on local disk.
        return await asyncio.to_thread(torch.jit.load, str(MODELS / f"{model_id}.pt"))

    @batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def __call__(self, requests: list[dict]) -> list[dict]:
        model = await self.load_model(get_multiplexed_model_id())
        inputs = torch.tensor([request["inputs"] for request in requests], dtype=torch.float32)
        with torch.inference_mode():
            outputs = await asyncio.to_thread(model, inputs)
        return [{"outputs": row} for row in outputs.tolist()]
