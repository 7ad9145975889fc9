"""The user-code loop: work runs in its own thread, streams keep their window, cancellation reaches it."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from modelplex_replica.usercode import UserCodeLoop


@pytest.fixture
async def user():
    loop = UserCodeLoop()
    loop.start()
    yield loop
    await loop.stop()


async def test_a_coroutine_runs_on_the_user_thread_and_its_result_comes_back(user):
    async def where() -> str:
        return threading.current_thread().name

    assert await user.run(where()) == "modelplex-user-code"


async def test_the_calling_loop_keeps_running_while_user_code_blocks_its_own(user):
    release = threading.Event()

    async def compute():  # a synchronous forward pass inside async def, as users write it
        release.wait(30)
        return "done"

    work = asyncio.ensure_future(user.run(compute()))
    for _ in range(100):  # the caller's loop turns while the user loop is held
        await asyncio.sleep(0)
    assert not work.done()
    release.set()
    assert await asyncio.wait_for(work, 10) == "done"


async def test_errors_cross_the_hop_with_their_type(user):
    async def fail():
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        await user.run(fail())


async def test_cancelling_the_caller_cancels_the_work_on_the_user_loop(user):
    started, cancelled = threading.Event(), threading.Event()

    async def slow():
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    work = asyncio.ensure_future(user.run(slow()))
    await asyncio.to_thread(started.wait, 10)
    work.cancel()
    assert await asyncio.to_thread(cancelled.wait, 10)


async def test_a_stream_yields_every_item_in_order_and_its_error_after_them(user):
    async def chunks():
        for i in range(50):
            yield i
        raise ValueError("broke after 50")

    got = []
    with pytest.raises(ValueError, match="broke after 50"):
        async for item in user.stream(chunks):
            got.append(item)
    assert got == list(range(50))


async def test_a_stream_producer_runs_at_most_window_items_ahead_of_its_reader(user):
    produced = []

    async def chunks():
        for i in range(100):
            produced.append(i)
            yield i

    stream = user.stream(chunks, window=3)
    assert await stream.__anext__() == 0
    await asyncio.sleep(0.2)  # time for the producer to run ahead as far as it may
    assert len(produced) == 1 + 3  # the one taken, and the window
    rest = [item async for item in stream]
    assert rest == list(range(1, 100))


async def test_closing_a_stream_closes_the_generator_on_the_user_loop(user):
    closed_on = []

    async def chunks():
        try:
            for i in range(1000):
                yield i
        finally:
            closed_on.append(threading.current_thread().name)

    stream = user.stream(chunks, window=2)
    assert await stream.__anext__() == 0
    await stream.aclose()
    for _ in range(100):
        if closed_on:
            break
        await asyncio.sleep(0.01)
    assert closed_on == ["modelplex-user-code"]


async def test_user_code_and_the_threads_it_starts_run_at_a_lower_cpu_priority_than_the_server(user):
    import os

    from modelplex_replica.usercode import USER_CODE_NICENESS

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def user_and_worker() -> tuple[int, int]:
        return niceness(), await asyncio.to_thread(niceness)

    server = niceness()
    assert await user.run(user_and_worker()) == (min(19, server + USER_CODE_NICENESS),) * 2
    assert niceness() == server


async def test_generators_that_compute_take_turns_chunk_by_chunk(user):
    import time

    produced: list[str] = []

    def chunks(name: str):
        async def generate():
            for i in range(6):
                time.sleep(0.01)  # a forward pass per chunk, never awaiting: as users write it
                produced.append(name)
                yield i
        return generate

    async def read(name: str) -> list[int]:
        return [item async for item in user.stream(chunks(name), window=4)]

    first = asyncio.ensure_future(read("a"))
    second = asyncio.ensure_future(read("b"))
    assert await first == await second == list(range(6))
    # A stream whose reader keeps up never fills its window: unless the producer yields after
    # each chunk, one stream runs to its end while the other's first chunk waits behind it.
    runs = "".join(produced).replace("ab", "a b").replace("ba", "b a").split()
    assert max(len(run) for run in runs) <= 2, produced


async def test_streams_read_on_the_user_loop_itself_take_turns_and_close_their_generators(user):
    import time

    produced: list[str] = []
    closed: list[str] = []

    def chunks(name: str):
        async def generate():
            try:
                for i in range(6):
                    time.sleep(0.01)  # computing, never awaiting
                    produced.append(name)
                    yield i
            finally:
                closed.append(name)
        return generate

    async def read_both() -> tuple[list[int], list[int], list[int]]:
        async def read(name: str, limit: int) -> list[int]:
            stream = user.stream(chunks(name))  # on the user loop: read in place, no hop
            items = []
            try:
                async for item in stream:
                    items.append(item)
                    if len(items) == limit:
                        break
            finally:
                await stream.aclose()
            return items

        whole = asyncio.gather(read("a", 6), read("b", 6))
        return (*await whole, await read("c", 2))

    a, b, c = await user.run(read_both())
    assert a == b == list(range(6)) and c == [0, 1]
    runs = "".join(p for p in produced if p != "c").replace("ab", "a b").replace("ba", "b a").split()
    assert max(len(run) for run in runs) <= 2, produced
    assert sorted(closed) == ["a", "b", "c"]  # the one left after two items too


async def test_an_answer_and_its_error_cross_back_in_bulk_without_losing_one(user):
    async def square(i: int) -> int:
        if i == 13:
            raise ValueError("thirteen")
        return i * i

    results = await asyncio.gather(*(user.run(square(i)) for i in range(200)), return_exceptions=True)
    assert [r for i, r in enumerate(results) if i != 13] == [i * i for i in range(200) if i != 13]
    assert isinstance(results[13], ValueError)


async def test_work_posted_while_the_user_loop_naps_on_a_short_timer_is_run_when_the_nap_ends(user):
    import time

    async def nap_repeatedly(until: float) -> int:  # a batch waiting 1 ms for more requests, again and again
        naps = 0
        while time.monotonic() < until:
            await asyncio.sleep(0.001)
            naps += 1
        return naps

    async def where() -> str:
        return threading.current_thread().name

    napping = asyncio.ensure_future(user.run(nap_repeatedly(time.monotonic() + 1.0)))
    started = time.monotonic()
    for _ in range(200):  # each one posted at a random point of a nap, or between two
        assert await asyncio.wait_for(user.run(where()), 5) == "modelplex-user-code"
    assert time.monotonic() - started < 5  # none waited for more than its nap
    assert await napping > 10


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


async def test_an_inner_stream_a_failing_generator_held_is_closed_once_its_error_is_read(user, no_cycle_collector):
    source = _Source()

    async def chunks():
        inner = source.items()  # in the generator's frame, which the error's traceback holds
        async for i in inner:
            if i == 3:
                raise ValueError("chunk 3 is corrupt")
            yield i

    got = []
    with pytest.raises(ValueError, match="corrupt"):
        async for item in user.stream(chunks):
            got.append(item)
    assert got == [0, 1, 2]
    assert await asyncio.to_thread(source.closed.wait, 5)


async def test_an_inner_stream_an_abandoned_generator_held_is_closed_when_the_reader_leaves(user, no_cycle_collector):
    source = _Source()
    waiting = threading.Event()

    async def chunks():
        inner = source.items()
        async for i in inner:
            yield i
            if i == 1:
                waiting.set()
                await asyncio.sleep(60)  # the reader leaves while the generator awaits

    stream = user.stream(chunks, window=1)
    assert [await stream.__anext__(), await stream.__anext__()] == [0, 1]
    await asyncio.to_thread(waiting.wait, 5)
    await stream.aclose()
    assert await asyncio.to_thread(source.closed.wait, 5)


async def test_an_inner_stream_a_failing_coroutine_held_is_closed_once_its_error_is_raised(user, no_cycle_collector):
    source = _Source()

    async def handler():
        inner = source.items()
        async for i in inner:
            if i == 3:
                raise ValueError("chunk 3 is corrupt")

    with pytest.raises(ValueError, match="corrupt"):
        await user.run(handler())
    assert await asyncio.to_thread(source.closed.wait, 5)
