"""A model class as a user writes one, for ``modelSource.format: safetensors`` (copied beside the
test's manifest: the replica imports it from there, as it does handlers)."""

import torch


class Mlp(torch.nn.Module):
    def __init__(self, width: int = 16, hidden: int = 32, out: int = 4):
        super().__init__()
        self.inner = torch.nn.Linear(width, hidden)
        self.outer = torch.nn.Linear(hidden, out)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(features)))
