"""The benchmark's model class (copied beside its manifests: the replica imports it from there for
``modelSource.format: safetensors``, as a user's own class would be).

One class serves both roles, since a deployment names one class and one set of ``kwargs``: the
steady model answers batches of rows (a forward of a few ms on one core), the swapped models
are the same shape (about 50 MB each at the defaults) with other weights.
"""

import torch


class Block(torch.nn.Module):
    """``depth`` square layers of ``width`` and a narrow head: ``4 * depth * width**2`` bytes."""

    def __init__(self, width: int = 1024, depth: int = 12, out: int = 8):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(depth)))
        self.head = torch.nn.Linear(width, out)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.layers(features)))
