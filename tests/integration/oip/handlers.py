"""Handlers for the OIP and HTTP-edge tests, written as users write them (copied beside each manifest).

``Tensors`` takes tensors by either protocol: an OIP request's arrays, or a native
``{"inputs": [...]}`` body; it answers arrays (OIP) or ``{"outputs": ...}`` (native).
``Events`` streams a few computed chunks; ``Hello`` answers a body-less GET, as Ray's docs call it.
``HalfStream`` returns a generator of FP16 tensors (a plain method that streams), counting its
calls in ``half-stream-calls`` beside this file, so a test sees whether it ran again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelplex.wire.oip import InferRequest


class Tensors:
    async def __call__(self, body):
        if isinstance(body, InferRequest):
            # Every input back as it came, and a computed one: the sum of the numeric inputs.
            outputs = {f"{name}_echo": array for name, array in body.inputs.items()}
            numeric = [a for a in body.inputs.values() if a.dtype != object]
            if numeric:
                outputs["total"] = np.array([float(sum(a.astype(np.float64).sum() for a in numeric))])
            return outputs
        return {"outputs": np.asarray(body["inputs"], dtype=np.float32) * 2}


class Events:
    async def __call__(self, body):
        total = 0
        for step in range(3):
            total += step * step  # a computed chunk, not a sleep
            yield {"step": step, "total": total}


class Hello:
    async def __call__(self, body):
        return {"hello": "world", "body_bytes": len(body) if isinstance(body, (bytes, bytearray)) else None}


class HalfStream:
    def __call__(self, body):
        with open(Path(__file__).with_name("half-stream-calls"), "a") as calls:
            calls.write("called\n")
        return self._chunks(body)

    def _chunks(self, body):
        for step in range(3):
            yield {"half": np.full(4, step, dtype=np.float16)}  # computed per chunk
