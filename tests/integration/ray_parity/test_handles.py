"""Handles as Ray's DeploymentHandle: eager responses, methods by name, types and errors kept.

Calls go from this test process through each deployment's real router to its real replica.
"""

import asyncio

import numpy
import pytest
import torch

from modelplex import handle
from modelplex.wire.errors import BadRequest, HandlerError, ModelplexError


def deployment(stack, name):
    return handle(name, url=stack.url(name))


def assert_batched_in_fours(sizes):
    # [4, 4] when all eight arrive within the seed's 0.1 s window; on a loaded machine a late
    # one may start a third batch. A client that sent lazily would make eight batches of 1.
    assert sum(sizes) == 8 and max(sizes) == 4, sizes


def test_the_seeds_batching_client_forms_batches_of_four_without_an_event_loop(stack):
    """The seed: ``responses = [handle.run.remote(i) for i in range(8)]`` — eight requests
    sent at once, answered individually and in order, in batches of 4."""
    h = deployment(stack, "batched")
    before = len(h.batch_sizes.remote().result())
    responses = [h.run.remote(i) for i in range(8)]
    for i, response in enumerate(responses):
        assert response.result(timeout_s=30) == i * 2
    assert_batched_in_fours(h.batch_sizes.remote().result()[before:])


async def test_the_seeds_batching_client_forms_batches_of_four_in_a_loop(stack):
    h = deployment(stack, "batched")
    before = len(await h.batch_sizes.remote())
    responses = [h.run.remote(i) for i in range(8)]
    for i, response in enumerate(responses):
        assert await response == i * 2
    assert_batched_in_fours((await h.batch_sizes.remote())[before:])


async def test_twenty_calls_share_batches(stack):
    # Ray's test_batching: the counter moves once per batch, so it ends below 20.
    h = deployment(stack, "batched")
    counts = await asyncio.gather(*[h.counted.remote(1) for _ in range(20)])
    assert max(counts) < 20


async def test_a_batched_method_that_returns_no_list_fails_its_callers(stack):
    with pytest.raises(TypeError, match="returned int for a batch of 1"):
        await deployment(stack, "batched").not_a_list.remote(1)


@pytest.mark.parametrize("mode", ["args", "kwargs", "mixed", "out-of-order"])
async def test_several_arguments_batch_across_the_network(stack, mode):
    pairs = deployment(stack, "batched").pairs
    calls = {
        "args": [pairs.remote("hi1", "hi2"), pairs.remote("hi3", "hi4")],
        "kwargs": [pairs.remote(key1="hi1", key2="hi2"), pairs.remote(key1="hi3", key2="hi4")],
        "mixed": [pairs.remote("hi1", key2="hi2"), pairs.remote("hi3", key2="hi4")],
        "out-of-order": [pairs.remote(key2="hi2", key1="hi1"), pairs.remote(key2="hi4", key1="hi3")],
    }[mode]
    assert [await call for call in calls] == [("hi1", "hi2"), ("hi3", "hi4")]


async def test_arguments_and_results_keep_their_types(stack):
    echo = deployment(stack, "echo")
    values = ("text", b"\x00raw", None, (1, ("nested",)), {1, 2}, {"k": [1.5, None]}, 7, True)
    assert await echo.types.remote(*values) == ["str", "bytes", "NoneType", "tuple", "set", "dict", "int", "bool"]
    args, kwargs = await echo.echo.remote(*values, key=("a", b"b"))
    assert args == values and type(args) is tuple
    assert kwargs == {"key": ("a", b"b")}


async def test_tensors_and_arrays_cross_as_themselves(stack):
    echo = deployment(stack, "echo")
    total = await echo.tensor_sum.remote(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert isinstance(total, torch.Tensor) and total.tolist() == [3.0, 5.0, 7.0]
    doubled = await echo.array_double.remote(numpy.arange(4, dtype=numpy.int32))
    assert doubled.dtype == numpy.int32 and doubled.tolist() == [0, 2, 4, 6]


async def test_dunder_call_gets_none_and_strings_as_they_are(stack):
    echo = deployment(stack, "echo")
    with pytest.raises(TypeError, match="body"):  # __call__ needs its argument, as a Python call would
        await echo.remote()
    assert await echo.remote(None) == {"body": None, "type": "NoneType"}
    assert await echo.remote("a string") == {"body": "a string", "type": "str"}


async def test_user_exceptions_arrive_with_their_type_and_message(stack):
    echo = deployment(stack, "echo")
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        await echo.fail.remote("zero")
    with pytest.raises(KeyError, match="missing"):
        await echo.fail.remote("key")
    with pytest.raises(HandlerError, match="tenant over quota") as raised:
        await echo.fail.remote("custom")
    assert type(raised.value).__name__ == "QuotaExceeded" and raised.value.error_type == "QuotaExceeded"


async def test_an_answer_that_cannot_be_sent_says_why(stack):
    """Bug 2 of the issue: it was a bare 500 "internal error; see the server log"."""
    with pytest.raises(TypeError, match="cannot travel"):
        await deployment(stack, "echo").unsendable.remote()


async def test_missing_and_private_methods_are_clear_errors(stack):
    echo = deployment(stack, "echo")
    with pytest.raises(ModelplexError, match="has no method 'nope'.*echo") as raised:
        await echo.nope.remote()
    assert raised.value.status == 404
    with pytest.raises(ModelplexError, match="has no method '_secret'"):
        await echo.options(method_name="_secret").remote()


async def test_an_argument_that_cannot_travel_fails_at_the_call(stack):
    with pytest.raises(TypeError, match="cannot travel"):
        deployment(stack, "echo").echo.remote(object())


async def test_a_response_passed_as_an_argument_is_awaited_first(stack):
    args, kwargs = await deployment(stack, "delegate").chained.remote(3)
    assert args == (((3,), {}),) and kwargs == {}


async def test_a_model_id_travels_with_the_call(stack):
    echo = deployment(stack, "echo")
    assert await echo.options(multiplexed_model_id="meta-llama/Llama-2-7b-hf").model.remote() == \
        "meta-llama/Llama-2-7b-hf"
    with pytest.raises(BadRequest, match="control"):
        echo.options(multiplexed_model_id="bad\nid")


async def test_a_response_is_sent_before_it_is_awaited(stack):
    # Eager: the call reaches the deployment even if nobody awaits it yet.
    h = deployment(stack, "batched")
    before = len(await h.batch_sizes.remote())
    response = h.run.remote(21)
    for _ in range(100):
        if len(await h.batch_sizes.remote()) > before:
            break
        await asyncio.sleep(0.05)
    assert len(await h.batch_sizes.remote()) == before + 1
    assert await response == 42


def test_result_inside_an_event_loop_is_refused_with_a_hint(stack):
    async def inside():
        response = deployment(stack, "echo").echo.remote(1)
        with pytest.raises(RuntimeError, match="use `await`"):
            response.result()
        return await response

    assert asyncio.run(inside()) == ((1,), {})
