"""Handlers for the composition tests (copied beside the test manifests).

``Upstream`` calls ``Downstream`` through a handle with a model id, as in Ray Serve's
composition example; ``Producer`` streams big chunks and can fail part way; ``Collector``
reads a ``Producer`` stream through a handle and reports what it got.
"""

from __future__ import annotations

import asyncio
import os

from modelplex import get_multiplexed_model_id, handle, multiplexed
from modelplex.wire.errors import ModelplexError


class Downstream:
    @multiplexed(max_num_models_per_replica=2)
    async def load_model(self, model_id: str) -> dict:
        await asyncio.sleep(0.02)
        return {"id": model_id, "pid": os.getpid()}

    async def __call__(self, body):
        model = await self.load_model(get_multiplexed_model_id())
        return {"model": get_multiplexed_model_id(), "loaded": model["id"], "echo": body}


class Upstream:
    """Asks Downstream for the model the body names, else for its own request's model."""

    def __init__(self):
        self.downstream = handle("downstream")

    async def __call__(self, body):
        model_id = body.get("model") if isinstance(body, dict) and body.get("model") else get_multiplexed_model_id()
        answer = await self.downstream.options(multiplexed_model_id=model_id).remote(body)
        return {"upstream_model": get_multiplexed_model_id(), "downstream": answer}


class Producer:
    """``chunks`` records of about ``size`` bytes each; raises before record ``fail_at``."""

    async def __call__(self, body):
        for index in range(int(body.get("chunks", 3))):
            if index == body.get("fail_at"):
                raise RuntimeError(f"the producer broke at chunk {index}")
            yield {"index": index, "pad": "x" * int(body.get("size", 10))}
            await asyncio.sleep(0)


class Collector:
    """Reads a Producer stream through a handle; answers with what arrived and how it ended."""

    def __init__(self):
        self.producer = handle("producer").options(stream=True)

    async def __call__(self, body):
        got = []
        try:
            async with self.producer.remote(body) as stream:
                async for chunk in stream:
                    got.append({key: (len(value) if key == "pad" else value) for key, value in chunk.items()})
        except ModelplexError as error:
            return {"got": got, "error": {"type": type(error).__name__, "code": error.code, "message": error.message}}
        return {"got": got, "error": None}
