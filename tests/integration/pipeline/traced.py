"""The example's decoder with a trace a test can read (copied beside the test manifests).

The request body may carry, beside the video description:
- ``trace``: a folder; ``produced`` holds how many chunks the decoder has made so far, and
  ``outcome`` is written when it stops: ``done`` (all of them) or ``stopped`` (closed or
  cancelled part way), followed by the count;
- ``hold_last_until``: a file; the last chunk waits until it exists, so a test decides
  when the decoder can finish;
- ``corrupt_chunk``: the index of a chunk whose frames come out malformed (not uint8 RGB),
  which the next stage refuses.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import torch
from frames import pack
from stages import Decode, Video

GATE_TIMEOUT_S = 60.0


def _write(folder: Path | None, name: str, text: str) -> None:
    if folder is None:
        return
    scratch = folder / f".{name}.tmp"
    scratch.write_text(text)
    os.replace(scratch, folder / name)  # atomic: a reader never sees half a number


async def _wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not path.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


class TracedDecode(Decode):
    async def __call__(self, body):
        body = body if isinstance(body, dict) else {}
        trace = Path(body["trace"]) if body.get("trace") else None
        gate = Path(body["hold_last_until"]) if body.get("hold_last_until") else None
        last = Video.from_body(body).chunks - 1
        produced = 0
        outcome = "stopped"
        try:
            async for chunk in super().__call__(body):
                if chunk["chunk"] == last and gate is not None:
                    await _wait_for_file(gate)
                if chunk["chunk"] == body.get("corrupt_chunk"):
                    chunk["frames"] = pack(torch.zeros(2, 1, 4, 4))  # float32, one channel
                produced += 1
                _write(trace, "produced", str(produced))
                yield chunk
            outcome = "done"
        finally:
            _write(trace, "outcome", f"{outcome} {produced}")
