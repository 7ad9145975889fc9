"""Ray Serve's ``@serve.batch`` unit behaviour, rewritten for ``modelplex.batch``.

The cases follow ``python/ray/serve/tests/unit/test_batching.py`` in ray-project/ray (what each
checks, not its code). They run on looptime's virtual clock: ``asyncio.wait(..., timeout=0.1)``
and a 1000 s batch timeout cost no real time, and nothing waits on a sleep to synchronise.
"""

import asyncio
import logging

import numpy
import pytest
import torch

from modelplex import batch, get_multiplexed_model_id
from modelplex.context import reset_multiplexed_model_id, set_multiplexed_model_id
from modelplex.runtime import Runtime, runtime_scope
from modelplex.serve.exceptions import RayServeException

pytestmark = pytest.mark.looptime

MODES = ["args", "kwargs", "mixed", "out-of-order"]


def pair_function(use_class: bool, **options):
    """A batched ``(key1, key2) -> [(key1[i], key2[i])]`` as a method or a plain function."""
    if use_class:

        class Pairs:
            @batch(**options)
            async def method(self, key1, key2):
                return [(key1[i], key2[i]) for i in range(len(key1))]

        return Pairs().method

    @batch(**options)
    async def pairs(key1, key2):
        return [(key1[i], key2[i]) for i in range(len(key1))]

    return pairs


def two_calls(func, mode):
    """The same two calls, written the four ways a caller may pass two arguments."""
    if mode == "args":
        return [func("hi1", "hi2"), func("hi3", "hi4")]
    if mode == "kwargs":
        return [func(key1="hi1", key2="hi2"), func(key1="hi3", key2="hi4")]
    if mode == "mixed":
        return [func("hi1", key2="hi2"), func("hi3", key2="hi4")]
    return [func(key2="hi2", key1="hi1"), func(key2="hi4", key1="hi3")]


def echo_or_divide(use_class: bool, gate: asyncio.Event | None = None, **options):
    """A batched echo that fails the whole batch with ZeroDivisionError if one request is "raise"."""

    async def body(requests):
        if gate is not None:
            await gate.wait()
        if "raise" in requests:
            1 / 0
        return requests

    if use_class:

        class Echo:
            @batch(**options)
            async def method(self, requests):
                return await body(requests)

        return Echo().method

    @batch(**options)
    async def echo(requests):
        return await body(requests)

    return echo


def test_decorator_accepts_ray_forms_and_refuses_bad_arguments():
    @batch
    async def bare(requests):
        return requests

    @batch(max_batch_size=10, batch_wait_timeout_s=1.5)
    async def configured(requests):
        return requests

    class Methods:
        @batch
        async def bare(self, requests):
            return requests

        @batch(max_batch_size=1.0, batch_wait_timeout_s=0)  # an integral float and an int zero are fine
        async def integral(self, requests):
            return requests

    with pytest.raises(TypeError, match="async def"):

        @batch
        def not_async(requests):
            return requests

    with pytest.raises(TypeError, match="async def"):

        class NotAsync:
            @batch
            def method(self, requests):
                return requests

    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1, got 0"):
        batch(max_batch_size=0)
    with pytest.raises(TypeError, match="max_batch_size must be integer >= 1, got 1.1"):
        batch(max_batch_size=1.1)
    with pytest.raises(ValueError, match="batch_wait_timeout_s must be a float >= 0, got -0.1"):
        batch(batch_wait_timeout_s=-0.1)
    with pytest.raises(TypeError, match="batch_wait_timeout_s must be a float >= 0, got a"):
        batch(batch_wait_timeout_s="a")
    with pytest.raises(ValueError, match="max_concurrent_batches must be an integer >= 1, got 0"):
        batch(max_concurrent_batches=0)


def test_batch_size_fn_validation():
    """Ray's test_batch_size_fn_validation, its wording included."""
    with pytest.raises(TypeError, match="batch_size_fn must be a callable or None"):

        @batch(batch_size_fn="not_a_function")
        async def my_batch_handler(items):
            return items


@pytest.mark.parametrize("use_class", [True, False])
async def test_batch_of_one_runs_at_once_despite_a_long_timeout(use_class):
    echo = echo_or_divide(use_class, max_batch_size=1, batch_wait_timeout_s=1000)
    assert await echo("hi") == "hi"
    with pytest.raises(ZeroDivisionError):
        await echo("raise")


@pytest.mark.parametrize("use_class", [True, False])
async def test_zero_timeout_batches_what_waits_while_the_previous_batch_runs(use_class):
    gate = asyncio.Event()
    gate.set()
    echo = echo_or_divide(use_class, gate, max_batch_size=2, batch_wait_timeout_s=0)
    assert await echo("hi") == "hi"
    with pytest.raises(ZeroDivisionError):
        await echo("raise")

    gate.clear()
    first = asyncio.create_task(echo("hi1"))
    done, _ = await asyncio.wait([first], timeout=0.001)
    assert not done  # a batch of one runs and holds the worker
    second, third = asyncio.create_task(echo("hi2")), asyncio.create_task(echo("raise"))
    gate.set()
    assert await first == "hi1"
    # hi2 and raise waited together: one batch, one shared failure.
    with pytest.raises(ZeroDivisionError):
        await second
    with pytest.raises(ZeroDivisionError):
        await third


async def test_a_request_that_joins_before_its_batch_begins_rides_along():
    # The batch is due when the worker looks, but its task runs only after what the loop had
    # queued before it (in a replica: other requests' handlers). A request that joins then
    # must not wait through the batch's synchronous compute and go alone after it.
    batches = []

    @batch(max_batch_size=8, batch_wait_timeout_s=0)
    async def double(xs):
        batches.append(list(xs))
        return [2 * x for x in xs]

    first = asyncio.ensure_future(double(1))
    await asyncio.sleep(0)  # the first call joins; the worker is due next
    second = asyncio.ensure_future(double(2))  # queued behind the worker, ahead of the batch
    assert await asyncio.gather(first, second) == [2, 4]
    assert batches == [[1, 2]]


async def test_a_batch_waits_the_full_timeout_after_an_idle_queue():
    @batch(max_batch_size=10, batch_wait_timeout_s=0.25)
    async def no_op(requests):
        return ["No-op"] * len(requests)

    for _ in range(2):
        tasks = [asyncio.create_task(no_op(None)) for _ in range(9)]
        done, _ = await asyncio.wait(tasks, timeout=0.05)
        assert not done
        tasks.append(asyncio.create_task(no_op(None)))
        done, _ = await asyncio.wait(tasks, timeout=0.05)
        assert done == set(tasks)
        assert [task.result() for task in tasks] == ["No-op"] * 10
        await asyncio.sleep(0.25)  # virtual time: the queue stays empty for a whole timeout


async def test_more_waiting_requests_than_a_batch_all_finish():
    @batch(max_batch_size=2, batch_wait_timeout_s=10000)
    async def no_op(requests):
        return ["No-op"] * len(requests)

    tasks = [asyncio.create_task(no_op(None)) for _ in range(10)]
    done, pending = await asyncio.wait(tasks, timeout=0.5)
    assert len(done) == 10 and not pending


@pytest.mark.parametrize("use_class", [True, False])
async def test_a_batch_waits_for_its_size_under_a_long_timeout(use_class):
    echo = echo_or_divide(use_class, max_batch_size=3, batch_wait_timeout_s=1000)
    calls = [asyncio.create_task(echo("hi1")), asyncio.create_task(echo("hi2"))]
    done, _ = await asyncio.wait(calls, timeout=0.1)
    assert not done
    calls.append(asyncio.create_task(echo("hi3")))
    done, _ = await asyncio.wait(calls, timeout=100)
    assert done == set(calls)
    assert [call.result() for call in calls] == ["hi1", "hi2", "hi3"]

    calls = [asyncio.create_task(echo("hi1")), asyncio.create_task(echo("raise"))]
    done, _ = await asyncio.wait(calls, timeout=0.1)
    assert not done
    calls.append(asyncio.create_task(echo("hi3")))
    done, _ = await asyncio.wait(calls, timeout=100)
    assert done == set(calls)
    assert all(isinstance(call.exception(), ZeroDivisionError) for call in calls)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("use_class", [True, False])
async def test_several_arguments_are_batched_per_parameter(mode, use_class):
    func = pair_function(use_class, max_batch_size=2, batch_wait_timeout_s=1000)
    assert await asyncio.gather(*two_calls(func, mode)) == [("hi1", "hi2"), ("hi3", "hi4")]


def blocking_functions(use_class: bool, gate: asyncio.Event, ran: list, fail_until: asyncio.Event | None = None):
    """(unary, streaming) batched pair functions that wait for ``gate`` and record that they ran."""

    async def compute(key1, key2):
        if fail_until is not None and not fail_until.is_set():
            raise ValueError("not yet")
        await gate.wait()
        ran.append(len(key1))
        return [(key1[i], key2[i]) for i in range(len(key1))]

    options = {"max_batch_size": 2, "batch_wait_timeout_s": 1000}
    if use_class:

        class Pairs:
            @batch(**options)
            async def unary(self, key1, key2):
                return await compute(key1, key2)

            @batch(**options)
            async def streaming(self, key1, key2):
                yield await compute(key1, key2)

        instance = Pairs()
        return instance.unary, instance.streaming

    @batch(**options)
    async def unary(key1, key2):
        return await compute(key1, key2)

    @batch(**options)
    async def streaming(key1, key2):
        yield await compute(key1, key2)

    return unary, streaming


def start_two(func, use_gen):
    if use_gen:
        streams = [func("hi1", "hi2"), func("hi3", "hi4")]
        return [asyncio.create_task(stream.__anext__()) for stream in streams]
    return [asyncio.create_task(func("hi1", "hi2")), asyncio.create_task(func("hi3", "hi4"))]


@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("use_gen", [True, False])
async def test_a_batch_whose_callers_all_left_is_cancelled(use_class, use_gen):
    gate, ran = asyncio.Event(), []
    unary, streaming = blocking_functions(use_class, gate, ran)
    func = streaming if use_gen else unary
    tasks = start_two(func, use_gen)
    done, pending = await asyncio.wait(tasks, timeout=0.01)
    assert not done and len(pending) == 2

    tasks[0].cancel()
    done, pending = await asyncio.wait(tasks, timeout=0.01)
    assert len(done) == 1 and len(pending) == 1
    tasks[1].cancel()
    done, pending = await asyncio.wait(tasks, timeout=0.01)
    assert len(done) == 2 and not pending

    gate.set()
    await asyncio.sleep(1)
    assert ran == []  # the abandoned batch was cancelled, not run to its end
    assert await asyncio.gather(*start_two(func, use_gen)) == [("hi1", "hi2"), ("hi3", "hi4")]


@pytest.mark.parametrize("use_class", [True, False])
async def test_a_streaming_caller_cancelled_before_its_first_read_ran_is_dropped(use_class):
    """Issue 31, item 8: a task cancelled before its first step never runs its coroutine, so the
    read could not leave the queue itself, and its ghost took a place in the next batch (or held
    the next caller for the whole batch_wait_timeout_s)."""
    gate, ran = asyncio.Event(), []
    gate.set()
    _, streaming = blocking_functions(use_class, gate, ran)
    gone = streaming("gone1", "gone2")
    task = asyncio.create_task(gone.__anext__())
    task.cancel()  # before the task ever ran
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()

    tasks = start_two(streaming, use_gen=True)
    done, pending = await asyncio.wait(tasks, timeout=0.1)  # a batch of the two: far sooner than 1000 s
    assert not pending
    assert [t.result() for t in tasks] == [("hi1", "hi2"), ("hi3", "hi4")]
    assert ran == [2]  # one batch, of the two callers, without the one who left
    with pytest.raises(StopAsyncIteration):
        await gone.__anext__()


@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("use_gen", [True, False])
async def test_cancelling_callers_after_their_batch_failed_leaves_the_batcher_working(use_class, use_gen):
    gate, ran, healthy = asyncio.Event(), [], asyncio.Event()
    gate.set()
    unary, streaming = blocking_functions(use_class, gate, ran, fail_until=healthy)
    func = streaming if use_gen else unary
    for task in start_two(func, use_gen):
        task.cancel()
    healthy.set()
    assert await asyncio.gather(*start_two(func, use_gen)) == [("hi1", "hi2"), ("hi3", "hi4")]


@pytest.mark.parametrize("use_class", [True, False])
async def test_setters_change_the_next_batches(use_class):
    func = pair_function(use_class, max_batch_size=2, batch_wait_timeout_s=1000)
    assert func._get_max_batch_size() == 2
    assert func._get_batch_wait_timeout_s() == 1000

    tasks = [asyncio.create_task(func("hi1", "hi2")), asyncio.create_task(func("hi3", "hi4"))]
    done, pending = await asyncio.wait(tasks, timeout=0.1)
    assert not pending
    assert {task.result() for task in done} == {("hi1", "hi2"), ("hi3", "hi4")}

    func.set_max_batch_size(3)
    func.set_batch_wait_timeout_s(15000)
    assert func._get_max_batch_size() == 3
    assert func._get_batch_wait_timeout_s() == 15000

    tasks = [asyncio.create_task(func(f"hi{i}", f"hi{i + 1}")) for i in (1, 3, 5)]
    done, pending = await asyncio.wait(tasks, timeout=0.1)
    assert not pending
    assert {task.result() for task in done} == {("hi1", "hi2"), ("hi3", "hi4"), ("hi5", "hi6")}


async def test_a_forming_batch_keeps_the_settings_it_started_with():
    func = pair_function(False, max_batch_size=2, batch_wait_timeout_s=1000)
    func.set_max_batch_size(3)
    func.set_batch_wait_timeout_s(15000)
    assert (func._get_max_batch_size(), func._get_batch_wait_timeout_s()) == (3, 15000)

    pending = {asyncio.create_task(func("hi1", "hi2")), asyncio.create_task(func("hi3", "hi4"))}
    done, pending = await asyncio.wait(pending, timeout=0.1)
    assert not done and len(pending) == 2  # waits for a third

    func.set_max_batch_size(1)
    func.set_batch_wait_timeout_s(0)
    assert (func._get_max_batch_size(), func._get_batch_wait_timeout_s()) == (1, 0)
    done, pending = await asyncio.wait(pending, timeout=0.1)
    assert not done and len(pending) == 2  # still the batch of 3 it began as

    pending.add(asyncio.create_task(func("hi5", "hi6")))
    done, pending = await asyncio.wait(pending, timeout=0.1)
    assert not pending
    assert {task.result() for task in done} == {("hi1", "hi2"), ("hi3", "hi4"), ("hi5", "hi6")}

    # The next batch uses the new settings: a batch of one, at once.
    done, pending = await asyncio.wait([asyncio.create_task(func("hi1", "hi2"))], timeout=0.1)
    assert not pending and done.pop().result() == ("hi1", "hi2")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("length", [0, 2, 5])
async def test_batched_generators_stream_each_caller_its_items(mode, use_class, length):
    options = {"max_batch_size": 2, "batch_wait_timeout_s": 1000}
    if use_class:

        class Steps:
            @batch(**options)
            async def method(self, key1, key2):
                for step in range(length):
                    yield [(step, key1[i], key2[i]) for i in range(len(key1))]

        func = Steps().method
    else:

        @batch(**options)
        async def func(key1, key2):
            for step in range(length):
                yield [(step, key1[i], key2[i]) for i in range(len(key1))]

    # Both calls join the batch when made, so reading the first stream to its end works.
    streams = two_calls(func, mode)
    results = [[item async for item in streams[0]], [item async for item in streams[1]]]
    assert results == [[(step, "hi1", "hi2") for step in range(length)],
                       [(step, "hi3", "hi4") for step in range(length)]]


@pytest.mark.parametrize("error_type", ["runtime_error", "mismatched_lengths"])
async def test_a_batched_generator_failing_midway_fails_each_stream_then_ends_it(error_type):
    @batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def func(key1, key2):
        for step in range(5):
            results = [(step, key1[i], key2[i]) for i in range(len(key1))]
            if step == 2:
                if error_type == "runtime_error":
                    raise RuntimeError("Testing error")
                yield results * 2
            yield results

    calls = [("hi1", "hi2"), ("hi3", "hi4")]
    for (key1, key2), stream in zip(calls, [func(*args) for args in calls]):
        assert [await stream.__anext__() for _ in range(2)] == [(0, key1, key2), (1, key1, key2)]
        expected = RuntimeError if error_type == "runtime_error" else RayServeException  # Ray's, with its message
        with pytest.raises(expected):
            await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()


@pytest.mark.parametrize("stop_token", [StopAsyncIteration, StopIteration])
async def test_a_stop_token_ends_one_callers_stream_early(stop_token):
    callers = 4
    step = asyncio.Event()

    @batch(max_batch_size=callers, batch_wait_timeout_s=1000)
    async def finish_in_order(ids):
        for finished in range(1, callers + 1):
            step.clear()
            yield [stop_token] * finished + ids[finished:]
            await step.wait()

    streams = [finish_in_order(i) for i in range(callers)]
    for caller, stream in enumerate(streams):
        assert [item async for item in stream] == [caller] * caller  # one item per step until its stop
        step.set()


async def test_setters_work_while_a_batch_streams():
    @batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def three_times(key1, key2):
        for _ in range(3):
            yield [(key1[i], key2[i]) for i in range(len(key1))]

    first = [("hi1", "hi2"), ("hi3", "hi4")]
    streams = [three_times(*args) for args in first]
    for stream, expected in zip(streams, first):
        assert [await stream.__anext__() for _ in range(2)] == [expected, expected]

    three_times.set_max_batch_size(3)
    three_times.set_batch_wait_timeout_s(15000)
    assert (three_times._get_max_batch_size(), three_times._get_batch_wait_timeout_s()) == (3, 15000)

    second = [("hi1", "hi2"), ("hi3", "hi4"), ("hi5", "hi6")]
    streams_2 = [three_times(*args) for args in second]
    for stream, expected in zip(streams, first):
        assert await stream.__anext__() == expected
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    for stream, expected in zip(streams_2, second):
        assert [item async for item in stream] == [expected] * 3


def sized_handler(limit, seen):
    @batch(max_batch_size=limit, batch_wait_timeout_s=0.05, batch_size_fn=lambda items: sum(i["size"] for i in items))
    async def handler(requests):
        seen.append([request["value"] for request in requests])
        return [request["value"] for request in requests]

    return handler


async def test_batch_size_fn_defers_a_request_that_would_overflow_the_batch():
    seen = []
    handler = sized_handler(10, seen)
    results = await asyncio.wait_for(asyncio.gather(
        handler({"size": 6, "value": "first"}), handler({"size": 6, "value": "second"})), 1)
    assert results == ["first", "second"]
    assert seen == [["first"], ["second"]]


async def test_batch_size_fn_fails_a_request_larger_than_any_batch():
    handler = sized_handler(10, [])
    first = asyncio.create_task(handler({"size": 6, "value": "first"}))
    too_big = asyncio.create_task(handler({"size": 12, "value": "second"}))
    assert await first == "first"
    with pytest.raises(RuntimeError, match="larger than max_batch_size"):
        await too_big


async def test_batch_size_fn_puts_requests_that_fit_in_one_batch():
    seen = []
    handler = sized_handler(20, seen)
    calls = [handler({"size": size, "value": value}) for size, value in ((5, "a"), (6, "b"), (7, "c"))]
    assert await asyncio.wait_for(asyncio.gather(*calls), 1) == ["a", "b", "c"]
    assert seen == [["a", "b", "c"]]


# -- batches per model id (Ray's multiplexed batch queues) -------------------------------------------


def batch_recorder(records, **options):
    """A batched echo that records (model id, batch) and answers ``model:request``."""

    @batch(**options)
    async def by_model(requests):
        model_id = get_multiplexed_model_id()
        records.append((model_id, list(requests)))
        return [f"{model_id}:{request}" for request in requests]

    return by_model


async def call_for(model_id, func, request):
    token = set_multiplexed_model_id(model_id)
    try:
        return await func(request)
    finally:
        reset_multiplexed_model_id(token)


async def test_each_model_fills_its_own_batch():
    records = []
    func = batch_recorder(records, max_batch_size=5, batch_wait_timeout_s=1000)
    calls = [call_for(model, func, f"{model[-1]}-{i}") for i in range(5) for model in ("model-a", "model-b")]
    assert await asyncio.wait_for(asyncio.gather(*calls), 1) == [
        f"{model}:{model[-1]}-{i}" for i in range(5) for model in ("model-a", "model-b")]
    assert sorted((model, len(requests)) for model, requests in records) == [("model-a", 5), ("model-b", 5)]


async def test_a_models_batch_waits_to_fill_whatever_other_models_wait():
    records = []
    func = batch_recorder(records, max_batch_size=5, batch_wait_timeout_s=1000)
    first_a = [asyncio.create_task(call_for("model-a", func, f"a-{i}")) for i in range(4)]
    first_b = asyncio.create_task(call_for("model-b", func, "b-0"))
    done, _ = await asyncio.wait([*first_a, first_b], timeout=0.05)
    assert not done and records == []  # five requests wait, but no model has five

    last_a = asyncio.create_task(call_for("model-a", func, "a-4"))
    assert await asyncio.wait_for(asyncio.gather(*first_a, last_a), 1) == [f"model-a:a-{i}" for i in range(5)]
    done, _ = await asyncio.wait([first_b], timeout=0.05)
    assert not done and records == [("model-a", [f"a-{i}" for i in range(5)])]

    rest_b = [asyncio.create_task(call_for("model-b", func, f"b-{i}")) for i in range(1, 5)]
    assert await asyncio.wait_for(asyncio.gather(first_b, *rest_b), 1) == [f"model-b:b-{i}" for i in range(5)]
    assert records[1] == ("model-b", [f"b-{i}" for i in range(5)])


def queues_of(func):
    """The batch queues a batched function holds now, by model id (nothing is kept for idle models)."""
    return {model: queue for queues in vars(func).get("__modelplex_batch_queues__", {}).values()
            for model, queue in queues.items()}


async def test_a_models_queue_goes_when_idle_and_stays_while_it_has_work():
    release = asyncio.Event()

    @batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def blocked(requests):
        await release.wait()
        return requests

    # Served, or given up by its caller: either way nothing is left for the model.
    release.set()
    assert await call_for("model-a", blocked, "x") == "x"
    await asyncio.sleep(0.01)  # the worker ends after handing out the results
    assert queues_of(blocked) == {}
    release.clear()
    given_up = asyncio.create_task(call_for("model-b", blocked, "y"))
    await asyncio.sleep(0.01)
    given_up.cancel()
    await asyncio.wait([given_up])
    await asyncio.sleep(0.01)
    assert queues_of(blocked) == {}

    # A running batch and a request waiting behind it keep the queue, and the request is served.
    running = [asyncio.create_task(call_for("model-a", blocked, f"r-{i}")) for i in (1, 2)]
    await asyncio.sleep(0.01)
    third = asyncio.create_task(call_for("model-a", blocked, "r-3"))
    await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.gather(*running) == ["r-1", "r-2"]
    await asyncio.sleep(0.01)
    assert not third.done() and set(queues_of(blocked)) == {"model-a"}
    fourth = asyncio.create_task(call_for("model-a", blocked, "r-4"))
    assert await asyncio.wait_for(asyncio.gather(third, fourth), 1) == ["r-3", "r-4"]
    await asyncio.sleep(0.01)
    assert queues_of(blocked) == {}


# -- the warning when batches cannot fill -------------------------------------------------------------


async def test_a_batch_larger_than_max_ongoing_requests_is_a_warning(caplog):
    def warned() -> list[str]:
        messages = [r.getMessage() for r in caplog.records if r.name == "modelplex.batching"]
        caplog.clear()
        return messages

    bound = 5
    caplog.set_level(logging.WARNING, logger="modelplex.batching")
    with runtime_scope(Runtime(max_ongoing_requests=bound)):
        for size in (bound + 1, bound - 1, bound):  # at decoration, where the replica's limit is known
            func = batch(max_batch_size=size, batch_wait_timeout_s=1000)(_echo)
            messages = warned()
            if size > bound:
                assert len(messages) == 1
                assert (f"max_batch_size ({size}) x max_concurrent_batches (1) is larger than the replica's "
                        f"maxOngoingRequests ({bound})") in messages[0]
                assert f"at least {size}" in messages[0]
            else:
                assert messages == []
        for size in (bound + 1, bound - 1, bound):  # and by the setter
            func.set_max_batch_size(size)
            assert len(warned()) == (1 if size > bound else 0)

        func.set_max_batch_size(bound + 1)
        warned()
        assert await asyncio.gather(*(call_for(model, func, 1) for model in "abc")) == [1, 1, 1]
        assert warned() == []  # once per setting, not once per model's queue

        batch(max_batch_size=3, max_concurrent_batches=2)(_echo)
        assert "max_concurrent_batches (2)" in warned()[0]

    with runtime_scope(Runtime(max_ongoing_requests=bound, max_batch_size=bound + 3)):
        func = batch(max_batch_size=2)(_echo)  # the spec's maxBatchSize is the one in force
        assert f"max_batch_size ({bound + 3})" in warned()[0]

    batch(max_batch_size=1000)(_echo)  # outside a replica there is no limit to check against
    assert warned() == []


async def _echo(requests):
    return requests


# -- what a batched function may return (Ray's deployment-level test_batching.py) --------------------


async def test_a_batched_function_may_return_a_tensor_with_one_row_per_request():
    @batch(max_batch_size=3, batch_wait_timeout_s=1000)
    async def model(rows):
        return torch.tensor(rows) * 2  # as a model answers a stacked batch

    answers = await asyncio.gather(*(model([i, i + 1]) for i in range(3)))
    assert [answer.tolist() for answer in answers] == [[0, 2], [2, 4], [4, 6]]


async def test_a_batched_function_that_returns_no_sequence_is_a_type_error():
    @batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def count(requests):
        return len(requests)

    for result in await asyncio.gather(count(1), count(2), return_exceptions=True):
        assert isinstance(result, TypeError) and "returned int for a batch of 2" in str(result)


async def test_a_batched_generator_may_yield_arrays_and_dicts_then_stop_one_caller():
    @batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def steps(ids):
        yield [numpy.array([i, i]) for i in ids]  # compared elementwise by ==: never taken for a stop token
        yield [{"id": i} for i in ids]
        yield [StopIteration, {"id": ids[1], "last": True}]

    first, second = steps(0), steps(1)
    got_first = [item async for item in first]
    got_second = [item async for item in second]
    assert got_first[0].tolist() == [0, 0] and got_first[1:] == [{"id": 0}]
    assert got_second[0].tolist() == [1, 1] and got_second[1:] == [{"id": 1}, {"id": 1, "last": True}]
