"""Streaming through handles, as Ray's test_handle_streaming.py checks it: async and sync
generators, methods by name, a method that returns a generator, empty and failing streams,
two streams read in turn, generator functions as deployments — from this process and from
inside another deployment."""

import asyncio

import pytest

from modelplex import handle
from modelplex.wire.errors import HandlerError

STREAMERS = ["async-streamer", "sync-streamer"]


def streaming(stack, name):
    return handle(name, url=stack.url(name)).options(stream=True)


@pytest.mark.parametrize("name", STREAMERS)
async def test_every_way_to_call_a_generator_streams(stack, name):
    h = streaming(stack, name)
    assert [i async for i in h.remote(5)] == list(range(5))
    assert [i async for i in h.other_method.remote(5)] == list(range(5))
    assert [i async for i in h.options(method_name="other_method").remote(5)] == list(range(5))
    assert [i async for i in h.call_inner_generator.remote(5)] == list(range(5))
    assert await h.options(stream=False).unary.remote(5) == 5


@pytest.mark.parametrize("name", STREAMERS)
def test_a_stream_can_be_read_without_an_event_loop(stack, name):
    assert list(streaming(stack, name).remote(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", STREAMERS)
async def test_a_generator_called_without_stream_is_an_error(stack, name):
    """Ray's test_call_gen_without_stream_flag, its wording included."""
    h = handle(name, url=stack.url(name))
    with pytest.raises(TypeError, match=(r"Method '__call__' returned a generator. You must use "
                                         r"`handle.options\(stream=True\)` to call generators on a deployment.")):
        await h.remote(5)
    with pytest.raises(TypeError, match=(r"Method 'call_inner_generator' returned a generator. You must use "
                                         r"`handle.options\(stream=True\)` to call generators on a deployment.")):
        await h.call_inner_generator.remote(5)


@pytest.mark.parametrize("name", STREAMERS)
async def test_stream_true_on_a_unary_method_is_a_type_error(stack, name):
    """Ray's test_call_no_gen_with_stream_flag, its wording included."""
    with pytest.raises(TypeError, match=r"'unary' .* but it did not return a generator"):
        await streaming(stack, name).unary.remote(0).__anext__()


@pytest.mark.parametrize("name", STREAMERS)
async def test_a_generator_that_yields_nothing_ends_at_once(stack, name):
    with pytest.raises(StopAsyncIteration):
        await streaming(stack, name).remote(0).__anext__()


@pytest.mark.parametrize("name", STREAMERS)
async def test_an_exception_in_the_generator_reaches_the_reader_with_its_type(stack, name):
    with pytest.raises(RuntimeError, match="oopsies") as raised:
        await streaming(stack, name).remote(0, should_error=True).__anext__()
    assert isinstance(raised.value, HandlerError)


@pytest.mark.parametrize("name", STREAMERS)
async def test_two_streams_read_in_turn(stack, name):
    h = streaming(stack, name)
    one, two = h.remote(1), h.remote(2)
    assert await one.__anext__() == 0
    assert await two.__anext__() == 0
    with pytest.raises(StopAsyncIteration):
        await one.__anext__()
    assert await two.__anext__() == 1
    with pytest.raises(StopAsyncIteration):
        await one.__anext__()
    with pytest.raises(StopAsyncIteration):
        await two.__anext__()


@pytest.mark.parametrize("name", STREAMERS)
async def test_a_deployment_streams_from_another_through_its_handle(stack, name):
    delegate = handle("delegate", url=stack.url("delegate"))
    got = await delegate.remote({"target": name})
    assert got == {"call": [0, 1, 2, 3, 4], "other": [0, 1, 2, 3, 4], "by_option": [0, 1, 2, 3, 4],
                   "inner": [0, 1, 2, 3, 4], "unary": 5, "interleaved": [0, 0, 1, "end", "end"]}


async def test_cancelling_a_reader_closes_the_stream_upstream(stack, tmp_path):
    flag = tmp_path / "closed"
    # The next item comes 2 s after "hi": the read below is still waiting for it when cancelled.
    stream = streaming(stack, "text-streamer").remote({"kind": "disconnect", "flag": str(flag), "gap_s": 2})
    assert await stream.__anext__() == "hi"
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.05)  # the read is in flight on the handle loop
    assert not reader.done()
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    deadline = asyncio.get_running_loop().time() + 10
    while not flag.exists() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert flag.read_text() == "closed"  # the generator upstream was closed


@pytest.mark.parametrize("name", ["sync-gen-function", "async-gen-function"])
def test_a_generator_function_deployment_streams(stack, name):
    assert list(streaming(stack, name).remote(5)) == list(range(5))


async def test_a_deployment_streams_from_generator_function_deployments(stack):
    delegate = handle("delegate", url=stack.url("delegate"))
    assert await delegate.function_streams.remote() == {"sync-gen-function": list(range(5)),
                                                        "async-gen-function": list(range(5))}
