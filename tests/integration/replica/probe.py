"""Handlers for the replica's integration tests (copied beside each test's manifest)."""

import asyncio
import os
from pathlib import Path

from modelplex import batch, get_multiplexed_model_id, multiplexed


class Probe:
    """Multiplexed (capacity from the spec) and batched; reports batch sizes back."""

    @multiplexed(max_num_models_per_replica=3)
    async def load_model(self, model_id: str) -> dict:
        if model_id.startswith("broken"):
            raise RuntimeError(f"weights of {model_id} are corrupt")
        await asyncio.sleep(0.01)
        return {"id": model_id}

    @batch(max_batch_size=4, batch_wait_timeout_s=5.0)
    async def __call__(self, requests: list) -> list:
        model = await self.load_model(get_multiplexed_model_id())
        if os.environ.get("PROBE_SLOW_S"):
            await asyncio.sleep(float(os.environ["PROBE_SLOW_S"]))
        return [{"model": model["id"], "batch_size": len(requests), "echo": r} for r in requests]


class Streamer:
    """Yields a first chunk, then waits for the test's signal file before the last one."""

    async def __call__(self, body: dict):
        signal = Path(body["signal"])
        yield {"chunk": "first", "model": get_multiplexed_model_id()}
        for _ in range(600):  # bounded: at most 60 s
            if signal.exists():
                break
            await asyncio.sleep(0.1)
        yield {"chunk": "last", "signal_seen": signal.exists()}


class Ticker:
    """Streams a chunk every 10 ms (at most 60 s): a client may leave at any time."""

    async def __call__(self, body: dict):
        for tick in range(6000):
            yield {"tick": tick}
            await asyncio.sleep(0.01)


class FailsMidStream:
    async def __call__(self, body):
        yield {"chunk": 1}
        raise RuntimeError("stage exploded")


class Computes:
    """Synchronous torch work inside ``async def``, as users write it: forward passes that hold
    the loop they run on for ``body["seconds"]``."""

    def __init__(self):
        import torch

        torch.manual_seed(0)
        self.layer = torch.nn.Linear(256, 256)

    async def __call__(self, body: dict) -> dict:
        import time

        import torch

        passes = 0
        until = time.monotonic() + float(body["seconds"])
        with torch.no_grad():
            x = torch.randn(64, 256)
            while time.monotonic() < until:
                x = torch.tanh(self.layer(x))
                passes += 1
        return {"passes": passes}


class Collectable:
    """Reports what Python's garbage collector holds: a TorchScript module built in the
    constructor (it lives in reference cycles) must stay the collector's to free."""

    def __init__(self):
        import torch

        self.model = torch.jit.script(torch.nn.Linear(4, 4))

    async def __call__(self, body: dict) -> dict:
        import gc

        collected = gc.get_objects()  # the three generations; frozen objects are not among them
        return {"frozen": gc.get_freeze_count(), "handler_collectable": any(o is self for o in collected),
                "model_collectable": any(o is self.model for o in collected)}
