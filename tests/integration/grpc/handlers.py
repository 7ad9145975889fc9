"""Handlers for the gRPC tests, written as users write them (copied beside the manifest).

``Echo`` answers every input back and their sum; ``Countdown`` streams one computed tensor per
step, and before each step after the first waits (bounded) for the file named by its ``gate``
input to exist: a test writes it only once it has the step before, so a stream that arrived
whole at its end would fail here (the gate never opens) instead of finishing. From 13 it fails
after its first step.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np

from modelplex.wire.oip import InferRequest


class Echo:
    async def __call__(self, body: InferRequest):
        outputs = {f"{name}_echo": array for name, array in body.inputs.items()}
        numeric = [a for a in body.inputs.values() if a.dtype != object]
        if numeric:
            outputs["total"] = np.array([float(sum(a.astype(np.float64).sum() for a in numeric))])
        return outputs


class Countdown:
    async def __call__(self, body: InferRequest):
        start = int(body["start"].reshape(-1)[0])
        gate = body.inputs.get("gate")
        for step in range(start, 0, -1):
            if gate is not None and step != start:
                path = f"{gate.reshape(-1)[0].decode()}.{step}"
                for _ in range(600):  # up to a minute for the test to take the step before
                    if os.path.exists(path):
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise TimeoutError(f"the client never received step {step + 1}")
            yield {"step": np.array([step], dtype=np.int32), "square": np.array([float(step * step)])}
            if start == 13:
                raise ValueError("13 is unlucky: no more steps")


class Flood:
    """Streams ``count`` blocks of 256 KB, each computed as it goes (a client that stops reading
    soon leaves the router's writes waiting)."""

    async def __call__(self, body: InferRequest):
        for step in range(int(body["count"].reshape(-1)[0])):
            yield {"block": np.full(65536, step, dtype=np.float32)}
