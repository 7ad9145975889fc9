"""The user-code loop: its own thread at a lower priority, the replica's runtime with it; and
handler streams that take turns chunk by chunk and close what they hold."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from modelplex_replica.usercode import USER_CODE_NICENESS, TakingTurns, UserCodeLoop


@pytest.fixture
async def user():
    loop = UserCodeLoop()
    loop.start()
    yield loop
    await loop.stop()


async def test_a_coroutine_runs_on_the_user_thread_and_its_result_and_error_come_back(user):
    async def where() -> str:
        return threading.current_thread().name

    async def fail():
        raise KeyError("nope")

    assert await user.submit(where()) == "modelplex-user-code"
    with pytest.raises(KeyError, match="nope"):
        await user.submit(fail())


async def test_the_server_loop_keeps_running_while_user_code_blocks_its_own(user):
    release = threading.Event()

    async def compute():  # a synchronous forward pass inside async def, as users write it
        release.wait(30)
        return "done"

    work = asyncio.ensure_future(user.submit(compute()))
    for _ in range(100):  # the server's loop turns while the user loop is held
        await asyncio.sleep(0)
    assert not work.done()
    release.set()
    assert await asyncio.wait_for(work, 10) == "done"


async def test_stopping_cancels_what_still_runs_on_the_user_loop():
    loop = UserCodeLoop()
    loop.start()
    started, cancelled = threading.Event(), threading.Event()

    async def slow():
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.ensure_future(loop.submit(slow()))
    assert await asyncio.to_thread(started.wait, 10)
    await loop.stop()
    assert cancelled.is_set()


async def test_user_code_and_the_threads_it_starts_run_at_a_lower_cpu_priority_than_the_server(user):
    import os

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def user_and_worker() -> tuple[int, int]:
        return niceness(), await asyncio.to_thread(niceness)

    server = niceness()
    assert await user.submit(user_and_worker()) == (min(19, server + USER_CODE_NICENESS),) * 2
    assert niceness() == server


async def test_generators_that_compute_take_turns_chunk_by_chunk_and_are_closed():
    produced: list[str] = []
    closed: list[str] = []

    def chunks(name: str):
        async def generate():
            try:
                for i in range(6):
                    time.sleep(0.01)  # a forward pass per chunk, never awaiting: as users write it
                    produced.append(name)
                    yield i
            finally:
                closed.append(name)
        return generate

    async def read(name: str, limit: int) -> list[int]:
        stream = TakingTurns(chunks(name))
        items = []
        try:
            async for item in stream:
                items.append(item)
                if len(items) == limit:
                    break
        finally:
            await stream.aclose()
        return items

    a, b = await asyncio.gather(read("a", 6), read("b", 6))
    assert a == b == list(range(6)) and await read("c", 2) == [0, 1]
    # Unless the loop goes round after each chunk, one stream runs to its end while the other's
    # first chunk waits behind it.
    runs = "".join(p for p in produced if p != "c").replace("ab", "a b").replace("ba", "b a").split()
    assert max(len(run) for run in runs) <= 2, produced
    assert sorted(closed) == ["a", "b", "c"]  # the one left after two items too


class _Source:
    """An async generator the handler iterates (a stream from another deployment, say), with a
    record of when its ``finally`` ran: an ``async for`` that stops early does not close it;
    its last reference going away does (the loop's async-generator finalizer)."""

    def __init__(self):
        self.closed = threading.Event()

    async def items(self):
        try:
            for i in range(1000):
                await asyncio.sleep(0.001)
                yield i
        finally:
            self.closed.set()


@pytest.fixture
def no_cycle_collector():
    # The cyclic collector runs when allocations say so, maybe minutes later; with it off, what
    # the stream keeps alive in a reference cycle stays alive, and the tests below see it.
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_an_inner_stream_a_failing_generator_held_is_closed_once_its_error_is_read(no_cycle_collector):
    source = _Source()

    async def chunks():
        inner = source.items()  # in the generator's frame, which the error's traceback holds
        async for i in inner:
            if i == 3:
                raise ValueError("chunk 3 is corrupt")
            yield i

    got = []
    stream = TakingTurns(chunks)
    with pytest.raises(ValueError, match="corrupt"):
        async for item in stream:
            got.append(item)
    await stream.aclose()
    assert got == [0, 1, 2]
    assert await asyncio.to_thread(source.closed.wait, 5)


async def test_an_inner_stream_an_abandoned_generator_held_is_closed_when_the_reader_leaves(no_cycle_collector):
    source = _Source()

    async def chunks():
        inner = source.items()
        async for i in inner:
            yield i

    stream = TakingTurns(chunks)
    assert [await stream.__anext__(), await stream.__anext__()] == [0, 1]
    await stream.aclose()
    assert await asyncio.to_thread(source.closed.wait, 5)
