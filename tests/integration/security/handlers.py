"""A multiplexed handler with a public method besides ``__call__``, as users write them."""

from __future__ import annotations

import torch

from modelplex import get_multiplexed_model_id, multiplexed


class Greeter:
    def __init__(self) -> None:
        self.greeting = "hello"

    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> torch.Tensor:
        return torch.full((2,), float(len(model_id)))

    async def __call__(self, request: dict) -> dict:
        weights = await self.load_model(get_multiplexed_model_id())
        return {"greeting": self.greeting, "score": float(weights.sum())}

    def set_greeting(self, greeting: str) -> str:
        """Public, but for the deployment's own handles only."""
        self.greeting = greeting
        return greeting
