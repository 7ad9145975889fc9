"""The SDK's runtime: scoped to a replica by a context variable, never a process-wide setting."""

from __future__ import annotations

import asyncio

from modelplex.batching import batch
from modelplex.runtime import Runtime, current_runtime, runtime_scope
from modelplex_replica.usercode import UserCodeLoop


def test_outside_a_replica_nothing_is_overridden_or_observed():
    runtime = current_runtime()
    assert runtime.max_batch_size is None and runtime.batch_observers == [] and runtime.cache_observers == []


async def test_a_scope_reaches_the_tasks_and_threads_started_in_it_and_ends_with_its_block():
    async def seen() -> Runtime:
        return current_runtime()

    replica = Runtime(max_batch_size=3)
    with runtime_scope(replica) as scoped:
        assert scoped is replica and current_runtime() is replica
        in_task = await asyncio.create_task(seen())
        in_thread = await asyncio.to_thread(current_runtime)
        with runtime_scope(Runtime(max_batch_size=5)):
            assert current_runtime().max_batch_size == 5
        assert current_runtime() is replica
    assert in_task is replica and in_thread is replica
    assert current_runtime() is not replica and current_runtime().max_batch_size is None


async def test_two_replicas_in_one_process_each_see_their_own_runtime():
    async def seen(runtime: Runtime) -> int | None:
        with runtime_scope(runtime):
            await asyncio.sleep(0)
            return current_runtime().max_batch_size

    assert await asyncio.gather(seen(Runtime(max_batch_size=2)), seen(Runtime(max_batch_size=7))) == [2, 7]


async def test_the_replicas_user_loop_runs_handler_code_in_the_replicas_runtime():
    sizes: list[int] = []
    replica = Runtime(max_batch_size=2, batch_wait_timeout_s=0.5, batch_observers=[lambda m, size, w: sizes.append(size)])

    @batch(max_batch_size=100, batch_wait_timeout_s=60)
    async def echo(requests):
        return requests

    async def echo_all():
        return await asyncio.gather(*(echo(i) for i in range(4)))

    user = UserCodeLoop()
    user.start()
    try:
        # As the replica's server loop starts the API port: inside the replica's runtime.
        with runtime_scope(replica):
            answers = await asyncio.wait_for(user.submit(echo_all()), 30)
            assert await user.submit(asyncio.to_thread(current_runtime)) is replica
    finally:
        await user.stop()
    assert answers == [0, 1, 2, 3] and sizes == [2, 2]  # the spec's batch size, and its observer
