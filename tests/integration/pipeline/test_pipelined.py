"""``pipelined``, the streaming orchestrator's core, in one process: order, window, errors,
closing. (The tests beside this one run it across real deployments.)"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pipeline"


def _load_orchestrators():
    spec = importlib.util.spec_from_file_location("pipeline_orchestrators", EXAMPLE / "orchestrators.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pipelined = _load_orchestrators().pipelined


class Source:
    """An async iterator of 0..count-1 that records how many items were taken and if it was closed."""

    def __init__(self, count: int, fail_at: int | None = None):
        self.count, self.fail_at = count, fail_at
        self.taken = 0
        self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> int:
        await asyncio.sleep(0)
        if self.taken == self.fail_at:
            raise RuntimeError(f"source broke at {self.taken}")
        if self.taken >= self.count:
            raise StopAsyncIteration
        self.taken += 1
        return self.taken - 1

    async def aclose(self) -> None:
        self.closed = True


async def test_results_come_out_in_order_when_work_finishes_out_of_order():
    async def work(item: int) -> int:
        await asyncio.sleep(0.02 * ((7 * item) % 5))  # later items often finish first
        return item * 10

    source = Source(20)
    results = [result async for result in pipelined(source, work, window=5)]
    assert results == [i * 10 for i in range(20)]
    assert source.closed


async def test_the_source_is_read_at_most_a_window_ahead_of_the_consumer():
    started: list[int] = []

    async def work(item: int) -> int:
        started.append(item)
        return item

    source = Source(1000)
    stream = pipelined(source, work, window=3)
    assert await stream.__anext__() == 0
    assert await stream.__anext__() == 1
    await asyncio.sleep(0.2)  # the consumer pauses: the reading must pause too
    assert source.taken <= 2 + 3
    assert len(started) <= 2 + 3
    await stream.aclose()
    assert source.closed


async def test_a_failing_work_raises_after_the_results_before_it_and_cancels_the_rest():
    cancelled: list[int] = []

    async def work(item: int) -> int:
        if item == 3:
            await asyncio.sleep(0.05)  # meanwhile the next items start (slots freed by 0..2)
            raise ValueError("chunk 3 is corrupt")
        try:
            await asyncio.sleep(5 if item > 3 else 0)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise
        return item

    source = Source(100)
    results = []
    with pytest.raises(ValueError, match="chunk 3 is corrupt"):
        async for result in pipelined(source, work, window=4):
            results.append(result)
    assert results == [0, 1, 2]
    assert cancelled and all(item > 3 for item in cancelled)
    assert source.closed and source.taken < 100


async def test_a_failing_source_raises_after_the_results_before_it():
    async def work(item: int) -> int:
        return item

    source = Source(100, fail_at=5)
    results = []
    with pytest.raises(RuntimeError, match="source broke at 5"):
        async for result in pipelined(source, work, window=2):
            results.append(result)
    assert results == [0, 1, 2, 3, 4]


async def test_cancelling_the_consumer_cancels_the_work_in_flight_and_closes_the_source():
    gate = asyncio.Event()
    running: set[int] = set()
    cancelled: set[int] = set()

    async def work(item: int) -> int:
        running.add(item)
        try:
            await gate.wait()  # never opened: the work is in flight when the consumer goes
        except asyncio.CancelledError:
            cancelled.add(item)
            raise
        return item

    source = Source(100)

    async def consume() -> None:
        async for _ in pipelined(source, work, window=4):
            pass

    task = asyncio.create_task(consume())
    for _ in range(100):
        if len(running) == 4:
            break
        await asyncio.sleep(0.01)
    assert running == {0, 1, 2, 3}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == {0, 1, 2, 3}
    assert source.closed


def test_a_window_below_one_is_refused():
    async def first():
        return await pipelined(Source(1), lambda item: item, window=0).__anext__()

    with pytest.raises(ValueError, match="window"):
        asyncio.run(first())
