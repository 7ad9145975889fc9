"""The dynamic batcher: size and timeout triggers, per-model queues, result routing, failures.

On looptime's virtual clock: timeouts cost no real time and no test sleeps to synchronise.
"""

import asyncio
import gc
import logging
import weakref

import pytest

from modelplex import batch, get_multiplexed_model_id
from modelplex.context import reset_multiplexed_model_id, set_multiplexed_model_id
from modelplex.runtime import Runtime, current_runtime, runtime_scope
from modelplex.wire.errors import HandlerError

pytestmark = pytest.mark.looptime

LONG = 30.0  # a timeout that never fires in a passing test


async def call_as(model_id, coroutine_function, *args):
    token = set_multiplexed_model_id(model_id)
    try:
        return await coroutine_function(*args)
    finally:
        reset_multiplexed_model_id(token)


class Doubler:
    def __init__(self):
        self.batches: list[tuple[str, list]] = []
        self.release = asyncio.Event()
        self.release.set()

    @batch(max_batch_size=4, batch_wait_timeout_s=LONG)
    async def __call__(self, requests):
        self.batches.append((get_multiplexed_model_id(), list(requests)))
        await self.release.wait()
        return [request * 2 for request in requests]


async def test_batch_forms_when_max_batch_size_requests_wait():
    doubler = Doubler()
    results = await asyncio.wait_for(asyncio.gather(*(call_as("m", doubler, i) for i in range(8))), 10)
    assert results == [i * 2 for i in range(8)]
    assert [len(requests) for _, requests in doubler.batches] == [4, 4]


async def test_batch_forms_after_the_wait_timeout_with_fewer_requests():
    class Slow:
        def __init__(self):
            self.sizes = []
            self.at = []

        @batch(max_batch_size=100, batch_wait_timeout_s=0.05)
        async def __call__(self, requests):
            self.sizes.append(len(requests))
            self.at.append(asyncio.get_running_loop().time())
            return requests

    handler = Slow()
    started = asyncio.get_running_loop().time()
    results = await asyncio.wait_for(asyncio.gather(*(call_as("m", handler, i) for i in range(3))), 10)
    assert results == [0, 1, 2]
    assert handler.sizes == [3]
    assert handler.at[0] - started == pytest.approx(0.05)  # exactly the wait timeout, on the virtual clock


async def test_batches_never_mix_model_ids():
    doubler = Doubler()
    calls = [call_as(f"model-{i % 2}", doubler, i) for i in range(8)]
    results = await asyncio.wait_for(asyncio.gather(*calls), 10)
    assert results == [i * 2 for i in range(8)]
    for model_id, requests in doubler.batches:
        assert {f"model-{r % 2}" for r in requests} == {model_id}
    assert sorted(len(requests) for _, requests in doubler.batches) == [4, 4]


async def test_a_batch_for_one_model_is_not_held_back_by_another_models_batch():
    class Gated:
        def __init__(self):
            self.gates = {"a": asyncio.Event(), "b": asyncio.Event()}
            self.gates["b"].set()

        @batch(max_batch_size=4, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            await self.gates[get_multiplexed_model_id()].wait()  # model a's batch hangs
            return [request * 2 for request in requests]

    gated = Gated()
    stuck = [asyncio.create_task(call_as("a", gated, i)) for i in range(4)]
    # b forms and finishes while a's batch, which started first, is still running.
    results = await asyncio.wait_for(asyncio.gather(*(call_as("b", gated, i) for i in range(4))), 10)
    assert results == [0, 2, 4, 6]
    assert not any(task.done() for task in stuck)
    gated.gates["a"].set()
    assert await asyncio.gather(*stuck) == [0, 2, 4, 6]


async def test_each_result_goes_back_to_its_own_caller():
    class Echo:
        @batch(max_batch_size=8, batch_wait_timeout_s=0.01)
        async def __call__(self, requests):
            return [{"echo": request} for request in reversed(list(reversed(requests)))]

    echo = Echo()
    results = await asyncio.gather(*(call_as("m", echo, f"req-{i}") for i in range(20)))
    assert results == [{"echo": f"req-{i}"} for i in range(20)]


@pytest.mark.parametrize("use_gen", [False, True])
async def test_a_finished_batch_leaves_its_requests_to_be_freed_without_the_garbage_collector(use_gen):
    # A request (a model's input tensor, a JSON body) must go as soon as its batch is done: left
    # in a reference cycle it waits for the garbage collector, holding its memory (a GPU's too)
    # and making every collection walk it.
    class Payload:
        pass

    class Unary:
        @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            return ["done" for _ in requests]

    class Streaming:
        @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            yield ["done" for _ in requests]

    handler = Streaming() if use_gen else Unary()

    async def one(payload):
        token = set_multiplexed_model_id("m")
        try:
            if use_gen:
                return [chunk async for chunk in handler(payload)]
            return await handler(payload)
        finally:
            reset_multiplexed_model_id(token)

    payloads = [Payload(), Payload()]
    freed = [weakref.ref(payload) for payload in payloads]
    gc.disable()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(one(payload) for payload in payloads)), 10)
        del payloads
        await asyncio.sleep(0)  # the batch's own end runs after its callers are answered
        assert results == ([["done"], ["done"]] if use_gen else ["done", "done"])
        assert [ref() for ref in freed] == [None, None]
    finally:
        gc.enable()


async def test_an_exception_fails_only_that_batchs_callers():
    class Fragile:
        def __init__(self):
            self.calls = 0

        @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            self.calls += 1
            if "boom" in requests:
                raise ValueError("bad batch")
            return requests

    fragile = Fragile()
    bad = asyncio.gather(call_as("m", fragile, "boom"), call_as("m", fragile, "x"), return_exceptions=True)
    bad_results = await asyncio.wait_for(bad, 10)
    good_results = await asyncio.wait_for(asyncio.gather(call_as("m", fragile, "y"), call_as("m", fragile, "z")), 10)
    assert all(isinstance(result, ValueError) for result in bad_results)
    assert good_results == ["y", "z"]


async def test_an_exception_in_the_results_fails_only_that_caller():
    class Picky:
        @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            return [ValueError("odd") if r % 2 else r for r in requests]

    picky = Picky()
    results = await asyncio.gather(call_as("m", picky, 2), call_as("m", picky, 3), return_exceptions=True)
    assert results[0] == 2
    assert isinstance(results[1], ValueError)


async def test_wrong_number_of_results_is_a_clear_error():
    class Short:
        @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            return requests[:1]

    short = Short()
    results = await asyncio.gather(call_as("m", short, 1), call_as("m", short, 2), return_exceptions=True)
    assert all(isinstance(result, HandlerError) for result in results)
    assert str(results[0]) == ("Batched function doesn't preserve batch size. The input list has length 2 "
                               "but the returned list has length 1.")  # Ray's RayServeException message


async def test_a_caller_that_goes_away_does_not_break_the_batcher():
    doubler = Doubler()
    doubler.release.clear()
    first = [asyncio.create_task(call_as("m", doubler, i)) for i in range(4)]
    while len(doubler.batches) < 1:  # the batch is running, held by release
        await asyncio.sleep(0)
    first[1].cancel()  # the client disconnected while its batch runs
    doubler.release.set()
    results = await asyncio.gather(*first, return_exceptions=True)
    assert results[0] == 0 and results[2] == 4 and results[3] == 6
    assert isinstance(results[1], asyncio.CancelledError)
    # The batcher keeps serving.
    assert await asyncio.wait_for(asyncio.gather(*(call_as("m", doubler, i) for i in range(4))), 10) == [0, 2, 4, 6]


def recording(max_batch_size: int, batch_wait_timeout_s: float):
    """A ``@batch`` handler that answers each request with itself and keeps every batch it got."""

    class Recorder:
        def __init__(self):
            self.batches = []

        @batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def __call__(self, requests):
            self.batches.append(list(requests))
            return requests

    return Recorder()


async def test_a_caller_cancelled_before_its_batch_forms_is_left_out():
    recorder = recording(3, 0.2)
    gone = asyncio.create_task(call_as("m", recorder, "gone"))
    await asyncio.sleep(0)  # it is queued
    gone.cancel()
    results = await asyncio.wait_for(asyncio.gather(call_as("m", recorder, "a"), call_as("m", recorder, "b")), 10)
    assert results == ["a", "b"]
    assert recorder.batches == [["a", "b"]]


async def test_spec_overrides_decorator_arguments():
    with runtime_scope(Runtime(max_batch_size=2, batch_wait_timeout_s=0.01)):
        handler = recording(100, LONG)
        await asyncio.wait_for(asyncio.gather(*(call_as("m", handler, i) for i in range(4))), 10)
    assert [len(requests) for requests in handler.batches] == [2, 2]
    assert current_runtime().max_batch_size is None  # the scope ended with the block


async def test_batched_generator_gives_each_caller_its_own_stream():
    class Streamer:
        @batch(max_batch_size=3, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            for step in range(max(requests)):
                yield [f"{r}:{step}" if step < r else StopIteration for r in requests]

    streamer = Streamer()

    async def collect(n):
        token = set_multiplexed_model_id("m")
        try:
            return [chunk async for chunk in streamer(n)]
        finally:
            reset_multiplexed_model_id(token)

    results = await asyncio.wait_for(asyncio.gather(collect(1), collect(3), collect(2)), 10)
    assert results == [["1:0"], ["3:0", "3:1", "3:2"], ["2:0", "2:1"]]


async def test_batched_generator_error_reaches_every_open_stream():
    class Broken:
        @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
        async def __call__(self, requests):
            yield requests
            raise RuntimeError("decoder died")

    broken = Broken()

    async def collect():
        token = set_multiplexed_model_id("m")
        chunks = []
        try:
            async for chunk in broken("x"):
                chunks.append(chunk)
        except RuntimeError as error:
            return chunks, str(error)
        finally:
            reset_multiplexed_model_id(token)
        return chunks, None

    results = await asyncio.wait_for(asyncio.gather(collect(), collect()), 10)
    assert results == [(["x"], "decoder died"), (["x"], "decoder died")]


def counting(**batch_options):
    """A ``@batch`` handler (2 a batch) whose batches take 1 s; ``most``: the most running at once."""

    class Counted:
        def __init__(self):
            self.running = 0
            self.most = 0

        @batch(max_batch_size=2, batch_wait_timeout_s=0.01, **batch_options)
        async def __call__(self, requests):
            self.running += 1
            self.most = max(self.most, self.running)
            await asyncio.sleep(1)
            self.running -= 1
            return requests

    return Counted()


async def test_max_concurrent_batches_bounds_the_batches_running_at_once():
    counted = counting(max_concurrent_batches=2)
    started = asyncio.get_running_loop().time()
    results = await asyncio.wait_for(asyncio.gather(*(call_as("m", counted, i) for i in range(8))), 10)
    assert results == list(range(8))
    assert counted.most == 2
    # Four batches of 2, two at a time: two rounds of 1 s on the virtual clock.
    assert asyncio.get_running_loop().time() - started == pytest.approx(2, abs=0.1)


async def test_one_batch_at_a_time_by_default():
    counted = counting()
    await asyncio.wait_for(asyncio.gather(*(call_as("m", counted, i) for i in range(8))), 10)
    assert counted.most == 1


async def test_a_setter_overrides_the_spec_which_overrides_the_decorator():
    @batch(max_batch_size=100, batch_wait_timeout_s=LONG)
    async def echo(requests):
        return requests

    with runtime_scope(Runtime(max_batch_size=2, batch_wait_timeout_s=0.01)):
        assert (echo._get_max_batch_size(), echo._get_batch_wait_timeout_s()) == (2, 0.01)
        echo.set_max_batch_size(5)
        assert (echo._get_max_batch_size(), echo._get_batch_wait_timeout_s()) == (5, 0.01)
    assert echo._get_batch_wait_timeout_s() == LONG  # outside a replica: the decorator's own
    with pytest.raises(ValueError):
        echo.set_max_batch_size(0)
    with pytest.raises(TypeError):
        echo.set_batch_wait_timeout_s(None)


async def test_a_raising_batch_observer_is_logged_and_callers_still_get_their_results(caplog):
    def broken_observer(model_id, size, waited_s):
        raise RuntimeError("metrics backend down")

    with runtime_scope(Runtime(batch_observers=[broken_observer])):
        doubler = Doubler()
        with caplog.at_level(logging.ERROR, logger="modelplex.batching"):
            results = await asyncio.wait_for(asyncio.gather(*(call_as("m", doubler, i) for i in range(4))), 10)
    assert results == [0, 2, 4, 6]
    assert "a batch observer failed" in caplog.text


async def test_a_failing_worker_fails_its_waiting_callers_and_the_next_call_starts_a_new_one():
    broken = True

    def size_of(values):
        if broken:
            raise ZeroDivisionError("size function bug")
        return len(values)

    @batch(max_batch_size=4, batch_wait_timeout_s=LONG, batch_size_fn=size_of)
    async def echo(requests):
        return requests

    results = await asyncio.wait_for(asyncio.gather(*(echo(i) for i in range(3)), return_exceptions=True), 10)
    assert all(isinstance(result, HandlerError) and "size function bug" in str(result) for result in results)
    broken = False
    assert await asyncio.wait_for(asyncio.gather(*(echo(i) for i in range(4))), 10) == [0, 1, 2, 3]


async def test_a_lone_request_larger_than_a_batch_fails_alone_and_the_batcher_goes_on(caplog):
    @batch(max_batch_size=10, batch_wait_timeout_s=LONG, batch_size_fn=lambda items: sum(items))
    async def total(requests):
        return requests

    with caplog.at_level(logging.ERROR, logger="modelplex.batching"):
        with pytest.raises(RuntimeError, match="larger than max_batch_size"):
            await asyncio.wait_for(total(11), 10)
        assert await asyncio.wait_for(asyncio.gather(total(4), total(6)), 10) == [4, 6]
    assert "failed" not in caplog.text


async def test_the_seeds_batching_client_gets_batches_of_four_in_order():
    """Eight calls made at once to ``max_batch_size=4, batch_wait_timeout_s=0.1``: two batches of 4."""

    class SimpleBatchedModel:
        def __init__(self):
            self.batches = []

        @batch(batch_wait_timeout_s=0.1, max_batch_size=4)
        async def run(self, multiple_samples):
            self.batches.append(list(multiple_samples))
            return [sample * 2 for sample in multiple_samples]

    model = SimpleBatchedModel()
    responses = [asyncio.ensure_future(model.run(i)) for i in range(8)]
    assert [await response for response in responses] == [i * 2 for i in range(8)]
    assert model.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_decorator_refuses_bad_arguments_and_sync_functions():
    with pytest.raises(ValueError, match="max_batch_size"):
        batch(max_batch_size=0)
    with pytest.raises(TypeError, match="async"):

        @batch
        def not_async(requests):
            return requests
