"""Handlers as users write them for browsers: a counter, and a generator that computes each chunk."""

from __future__ import annotations

import torch

from modelplex import get_multiplexed_model_id


class Counter:
    """Answers how many times it was called: a preflight that reached it would show."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: object) -> dict:
        self.calls += 1
        return {"calls": self.calls, "model": get_multiplexed_model_id()}


class Tokens:
    """Streams one chunk per step, each computed with torch."""

    async def __call__(self, request: object):
        weights = torch.arange(4, dtype=torch.float32)
        for step in range(3):
            yield {"model": get_multiplexed_model_id(), "step": step, "value": float((weights * step).sum())}
