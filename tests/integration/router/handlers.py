"""Model handlers for the router's integration tests (copied beside each test manifest).

``Echo`` answers once; ``Streamer`` streams. Both "load" a model by sleeping a little
(``LOAD_S``, env ``TEST_LOAD_S``) and say which process answered, so a test can tell where a
request went. A request body may ask for a delay (``sleep``) or a gate file to wait for.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from modelplex import get_multiplexed_model_id, multiplexed
from modelplex.wire.errors import ModelNotFound

LOAD_S = float(os.environ.get("TEST_LOAD_S", "0.05"))
GATE_TIMEOUT_S = 60.0


async def _wait_for_file(path: str) -> bool:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while time.monotonic() < deadline:
        if Path(path).exists():
            return True
        await asyncio.sleep(0.01)
    return False


class Echo:
    @multiplexed(max_num_models_per_replica=2)
    async def load_model(self, model_id: str) -> dict:
        await asyncio.sleep(LOAD_S)
        if model_id.startswith("missing-"):  # a model its source does not have: 404
            raise ModelNotFound(f"no model {model_id!r}")
        return {"id": model_id, "loaded_at": time.time()}

    async def __call__(self, body):
        model_id = get_multiplexed_model_id()
        model = await self.load_model(model_id) if model_id else None
        if isinstance(body, dict):
            if body.get("sleep"):
                await asyncio.sleep(float(body["sleep"]))
            if body.get("gate"):
                await _wait_for_file(body["gate"])
        return {
            "model": model["id"] if model else None,
            "pid": os.getpid(),
            "echo": body if not isinstance(body, bytes) else body.decode("latin-1"),
            "env": {k: v for k, v in os.environ.items() if k.startswith("MODELPLEX_ROUTER_")},
        }


class Streamer:
    @multiplexed(max_num_models_per_replica=2)
    async def load_model(self, model_id: str) -> dict:
        await asyncio.sleep(LOAD_S)
        return {"id": model_id}

    async def __call__(self, body):
        model = await self.load_model(get_multiplexed_model_id())
        body = body if isinstance(body, dict) else {}
        yield {"chunk": 0, "model": model["id"], "pid": os.getpid()}
        if body.get("die"):  # the replica process dies mid-stream, after the first chunk went out
            await asyncio.sleep(0.2)
            os._exit(1)
        if body.get("gate"):
            opened = await _wait_for_file(body["gate"])
            yield {"gate_opened": opened}
        pad = "x" * int(body.get("pad", 0))  # a large stream: this much more per chunk
        for i in range(1, int(body.get("chunks", 3))):
            yield {"chunk": i, "pad": pad} if pad else {"chunk": i}


class Forward:
    """CPU-bound, written the way users write it: a synchronous torch forward pass of a
    512→2048→2048→512 MLP over 48 rows inside ``async def`` (no thread, no await)."""

    def __init__(self):
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(512, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 512),
        ).eval()
        self.rows = torch.randn(48, 512)

    def forward(self) -> float:
        with self.torch.inference_mode():
            return float(self.mlp(self.rows).sum())

    async def __call__(self, body):
        return {"sum": self.forward(), "pid": os.getpid()}


class ForwardStream(Forward):
    """CPU-bound streaming: an async generator that computes each of its chunks."""

    async def __call__(self, body):
        chunks = int(body.get("chunks", 20)) if isinstance(body, dict) else 20
        for index in range(chunks):
            yield {"chunk": index, "sum": self.forward()}


class DiesAfterHead:
    """Notes each run in the file the body names, sends its status line and headers (an empty
    first chunk), then its process dies before any byte of the body: an answer that has begun."""

    async def __call__(self, body):
        with open(body["runs"], "a") as runs:
            runs.write(f"{os.getpid()}\n")
        yield b""
        await asyncio.sleep(0.3)  # the head is on its way
        os._exit(1)
