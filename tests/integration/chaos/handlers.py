"""Handlers for the chaos suite, written the way users write them (copied beside each manifest).

``Models``: a ``@multiplexed`` loader that builds a small torch MLP per model id, and a
synchronous forward pass inside ``async def``. Some ids misbehave as real stores do:
``hang-*`` loads never finish (a fetch that never answers), ``slow-*`` loads take
``CHAOS_SLOW_LOAD_S`` seconds, ``fail-*`` loads raise. A body ``{"work": s}`` keeps the request
busy for ``s`` seconds, computing in steps between awaits, as a long generation would.

``Stream``: an async generator that computes each of its chunks.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib

import torch

from modelplex import get_multiplexed_model_id, multiplexed

SLOW_LOAD_S = float(os.environ.get("CHAOS_SLOW_LOAD_S", "2"))


def build(model_id: str) -> torch.nn.Module:
    torch.manual_seed(zlib.crc32(model_id.encode()))
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).eval()


def forward(model: torch.nn.Module, rows: int = 16) -> float:
    with torch.inference_mode():
        return float(model(torch.randn(rows, 64)).sum())


class Models:
    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> torch.nn.Module:
        if model_id.startswith("hang-"):
            await asyncio.get_running_loop().create_future()  # the store never answers
        if model_id.startswith("fail-"):
            raise FileNotFoundError(f"no weights for {model_id}")
        model = build(model_id)
        if model_id.startswith("slow-"):
            await asyncio.sleep(SLOW_LOAD_S)  # the weights trickle in from a slow store
        return model

    async def __call__(self, body):
        model_id = get_multiplexed_model_id()
        model = await self.load_model(model_id)
        body = body if isinstance(body, dict) else {}
        total = forward(model)
        steps = 0
        until = time.monotonic() + float(body.get("work", 0))
        while time.monotonic() < until:  # a long request: compute, yield the loop, compute again
            await asyncio.sleep(0.1)
            total += forward(model)
            steps += 1
        return {"model": model_id, "pid": os.getpid(), "sum": total, "steps": steps}


class Stream:
    def __init__(self):
        self.model = build("stream")

    async def __call__(self, body):
        body = body if isinstance(body, dict) else {}
        for index in range(int(body.get("chunks", 10))):
            yield {"chunk": index, "sum": forward(self.model)}
            await asyncio.sleep(float(body.get("every", 0.2)))
