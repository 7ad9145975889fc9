"""A handler as users write them: each model a real torch module built by its loader (copied
beside each test's manifest)."""

import asyncio
import os

import torch

from modelplex import get_multiplexed_model_id, multiplexed

#: 2236 x 2236 float32 weights + bias: 20.0 MB per model.
WIDTH = int(os.environ.get("WEIGHTS_WIDTH", "2236"))


def build(model_id: str) -> torch.nn.Linear:
    """Real memory: every weight written (a model whose pages were never touched costs no RSS)."""
    model = torch.nn.utils.skip_init(torch.nn.Linear, WIDTH, WIDTH)
    with torch.no_grad():
        model.weight.fill_((sum(model_id.encode()) % 97) / 97.0)
        model.bias.zero_()
    return model.eval()


class Weights:
    """Ids starting with ``hang-once`` hang on their first load (a stuck connection), then load;
    ids starting with ``slow`` take ``SLOW_LOAD_S`` seconds to load."""

    def __init__(self):
        self.attempts: dict[str, int] = {}

    @multiplexed
    async def load_model(self, model_id: str) -> torch.nn.Linear:
        self.attempts[model_id] = self.attempts.get(model_id, 0) + 1
        if model_id.startswith("hang-once") and self.attempts[model_id] == 1:
            await asyncio.sleep(3600)
        if model_id.startswith("slow"):
            await asyncio.sleep(float(os.environ.get("SLOW_LOAD_S", "1")))
        return await asyncio.to_thread(build, model_id)

    async def __call__(self, body: dict) -> dict:
        model = await self.load_model(get_multiplexed_model_id())
        with torch.inference_mode():  # synchronous torch work inside async def, as users write it
            output = model(torch.ones(1, WIDTH))
        return {"model": get_multiplexed_model_id(), "value": float(output[0, 0]),
                "attempts": self.attempts[get_multiplexed_model_id()]}
