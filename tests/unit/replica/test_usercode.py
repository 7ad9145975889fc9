"""The user-code loop: work runs in its own thread, streams keep their window, cancellation reaches it."""

from __future__ import annotations

import asyncio
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
