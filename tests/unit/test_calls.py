"""Which method a request runs, how, and how its answer is encoded."""

import pytest

from modelplex import batch
from modelplex.calls import Invocation, call_mode, check_handler, invocation, iterate_in_thread, method_of
from modelplex.wire.codec import (CALL_CONTENT_TYPE, STREAM_CONTENT_TYPE, VALUE_CONTENT_TYPE, Call, decode_value,
                                  encode_call)
from modelplex.wire.errors import HandlerError, NotFound


class Model:
    async def __call__(self, body):
        return body

    def run(self, x, *, scale=2):
        return x * scale

    async def tokens(self, n):
        for i in range(n):
            yield i

    def frames(self, n):
        yield from range(n)

    @batch(max_batch_size=2)
    async def batched(self, items):
        for _ in range(2):
            yield items

    def _private(self):
        return "secret"


class OnlyMethods:
    def run(self, x):
        return x


class Nothing:
    pass


def test_modes_follow_how_the_target_is_written():
    model = Model()
    assert [call_mode(t) for t in (model, model.run, model.tokens, model.frames, model.batched)] == [
        "async", "sync", "stream", "sync_stream", "stream"]


def test_a_handle_call_runs_the_named_method_with_its_arguments():
    call = invocation(Model(), CALL_CONTENT_TYPE, encode_call(Call("run", ("ab",), {"scale": 3})))
    assert call.run() == "ababab" and call.mode == "sync" and call.typed
    body, content_type = call.encode((1, None))
    assert content_type == VALUE_CONTENT_TYPE and decode_value(body) == (1, None)


def test_a_plain_request_calls_dunder_call_with_its_body():
    call = invocation(Model(), "application/json", {"x": 1})
    assert call.mode == "async" and call.args == ({"x": 1},) and not call.typed
    assert call.encode({"x": 1}) == (b'{"x":1}', "application/json")


def test_private_and_missing_methods_are_not_found_with_the_methods_named():
    with pytest.raises(NotFound, match="has no method '_private'.*run"):
        method_of(Model(), "_private")
    with pytest.raises(NotFound, match="no method 'nope'"):
        method_of(Model(), "nope")


def test_a_class_without_dunder_call_answers_plain_requests_with_its_methods():
    with pytest.raises(NotFound, match="has no __call__.*run"):
        invocation(OnlyMethods(), "application/json", {})
    assert invocation(OnlyMethods(), CALL_CONTENT_TYPE, encode_call(Call("run", (5,)))).run() == 5


def test_a_handler_nothing_can_call_is_refused_at_start_up():
    """Bug 3 of the Ray parity issue: such a class started ready, then failed every request."""
    with pytest.raises(TypeError, match="nothing can call it"):
        check_handler(Nothing())
    check_handler(OnlyMethods())
    check_handler(Model())


def test_a_generator_called_without_stream_is_a_type_error_worded_as_rays():
    with pytest.raises(TypeError, match=r"Method 'tokens' returned a generator. You must use "
                                        r"`handle.options\(stream=True\)` to call generators on a deployment."):
        invocation(Model(), CALL_CONTENT_TYPE, encode_call(Call("tokens", (1,))))
    streamed = invocation(Model(), CALL_CONTENT_TYPE, encode_call(Call("frames", (1,), stream=True)))
    assert streamed.stream_content_type(0, sse=False) == STREAM_CONTENT_TYPE


async def test_stream_true_on_a_method_that_returns_no_generator_is_a_type_error():
    call = invocation(Model(), CALL_CONTENT_TYPE, encode_call(Call("run", (1,), stream=True)))
    with pytest.raises(HandlerError, match=r"'run' .* but it did not return a generator") as raised:
        [item async for item in call.items()]
    assert raised.value.error_type == "TypeError"


async def test_a_method_that_returns_a_generator_streams_it():
    class Inner:
        def numbers(self, n):
            yield from range(n)

        async def inner(self, n):
            return self.numbers(n)

        def inner_sync(self, n):
            return self.numbers(n)

    for method in ("inner", "inner_sync"):
        call = invocation(Inner(), CALL_CONTENT_TYPE, encode_call(Call(method, (3,), stream=True)))
        assert [item async for item in call.items()] == [0, 1, 2]
        unary = invocation(Inner(), CALL_CONTENT_TYPE, encode_call(Call(method, (3,))))
        produced = unary.run()
        produced = await produced if method == "inner" else produced
        with pytest.raises(HandlerError, match=f"Method '{method}' returned a generator"):
            unary.encode(produced)


async def test_a_plain_request_whose_handler_returns_a_generator_streams_it():
    """Issue 31, item 7: an HTTP client cannot ask for a stream, so what the handler returned is streamed."""
    class Returns:
        def numbers(self, n):
            yield from range(n)

        async def __call__(self, body):
            return self.numbers(body["n"])

    plain = invocation(Returns(), "application/json", {"n": 3})
    outcome = plain.outcome(await plain.run())
    assert isinstance(outcome, Invocation) and outcome.streams
    assert [item async for item in outcome.items()] == [0, 1, 2]
    assert plain.outcome({"n": 3}) == (b'{"n":3}', "application/json")


def test_an_answer_that_cannot_be_sent_is_a_handler_error_with_its_reason():
    """Bug 2 of the Ray parity issue: it was a bare 500 'internal error'."""
    plain = invocation(Model(), "application/json", {})
    with pytest.raises(HandlerError, match="cannot be sent"):
        plain.encode(object())
    typed = invocation(Model(), CALL_CONTENT_TYPE, encode_call(Call("run", (1,))))
    with pytest.raises(HandlerError, match="cannot travel"):
        typed.encode(object())
    assert decode_value(typed.encode({1, 2})[0]) == {1, 2}  # a set is fine through a handle


async def test_a_sync_generator_streams_item_by_item_from_a_thread():
    import threading

    main = threading.get_ident()
    seen_threads = []

    def frames():
        for i in range(3):
            seen_threads.append(threading.get_ident())
            yield i

    assert [item async for item in iterate_in_thread(frames())] == [0, 1, 2]
    assert main not in seen_threads
