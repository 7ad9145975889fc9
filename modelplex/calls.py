"""What a request asks a handler to run: which method, with which arguments, answered how.

Pure logic the replica applies to each request. A handle's request carries a call envelope
(:mod:`modelplex.wire.codec`): a method by name, its arguments with their types, and whether the
caller reads a stream; the answer uses the codec too. A plain HTTP request calls
``__call__`` with its body and is answered as JSON, text or bytes.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import sys
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Generator

from modelplex.batching import STREAMING_ATTR
from modelplex.http import encode_body, to_json
from modelplex.wire.codec import (CALL_CONTENT_TYPE, STREAM_CONTENT_TYPE, VALUE_CONTENT_TYPE, decode_call,
                                  encode_stream_error, encode_stream_item, encode_value)
from modelplex.wire.errors import HandlerError, ModelplexError, NotFound, remote_error_class
from modelplex.wire.streams import ndjson_error_frame, sse_error_frame


def call_mode(target: Callable) -> str:
    """How ``target`` (a function, a bound method or a callable instance) runs: "async" (a
    coroutine), "sync" (blocking: a worker thread), "stream" (an async iterator) or
    "sync_stream" (a generator: each item computed in a worker thread)."""
    function = target if inspect.isroutine(target) else getattr(type(target), "__call__", None)
    if function is None:
        raise TypeError(f"{target!r} is not callable")
    if getattr(function, STREAMING_ATTR, False) or inspect.isasyncgenfunction(function):
        return "stream"
    if inspect.isgeneratorfunction(function):
        return "sync_stream"
    return "async" if inspect.iscoroutinefunction(function) else "sync"


def public_methods(handler: Any) -> list[str]:
    """The methods a handle may call by name: public ones, and ``__call__``."""
    names = [name for name, member in inspect.getmembers(type(handler), callable)
             if not name.startswith("_") and not inspect.isclass(member)]
    return (["__call__"] if _has_call(handler) else []) + names


def check_handler(handler: Any) -> None:
    """Refuse, at start-up, a handler that no request could call (it would start ready and fail
    every request): one with neither ``__call__`` nor a public method."""
    if not public_methods(handler):
        raise TypeError(f"{type(handler).__qualname__} has no __call__ and no public method: nothing can call it")


def _has_call(handler: Any) -> bool:
    # Not getattr(type(handler), "__call__"): every class has one, its metaclass's.
    return inspect.isroutine(handler) or _defines_call(type(handler))


def _defines_call(klass: type) -> bool:
    return any("__call__" in vars(base) for base in klass.__mro__)


def _no_call(handler: Any) -> NotFound:
    return NotFound(f"{type(handler).__qualname__} has no __call__; call one of its methods through a "
                    f"handle: {', '.join(public_methods(handler)) or 'none'}")


def _whole_call_mode(handler: Any) -> str | None:
    """:func:`call_mode` of ``handler`` itself (None: it has no ``__call__``), known once per
    class: every plain HTTP request asks."""
    if inspect.isroutine(handler):
        return call_mode(handler)
    return _class_call_mode(type(handler))  # type: ignore[arg-type]  # a class is hashable; mypy reads type[Any] as not


@functools.lru_cache(maxsize=256)
def _class_call_mode(klass: type) -> str | None:
    if not _defines_call(klass):
        return None
    return call_mode(klass.__call__)


def _takes_arguments(handler: Any) -> bool:
    """Whether a plain HTTP request passes its body: not to a ``__call__(self)`` that takes
    nothing (Ray calls that one without arguments). Known once per class or function."""
    if inspect.isroutine(handler):
        return _parameters(handler, bound=False)
    return _parameters(type(handler).__call__, bound=True)


@functools.lru_cache(maxsize=256)
def _parameters(function: Callable, bound: bool) -> bool:
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: give it the body
        return True
    return len(parameters) > (1 if bound else 0)


def method_of(handler: Any, name: str) -> Callable:
    """The bound method ``name`` of ``handler``; a private or missing one is a clear error."""
    if name == "__call__":
        if not _has_call(handler):
            raise _no_call(handler)
        return handler
    target = getattr(handler, name, None) if not name.startswith("_") else None
    if target is None or not callable(target):
        raise NotFound(f"{type(handler).__qualname__} has no method {name!r}; it has "
                       f"{', '.join(public_methods(handler)) or 'none'}")
    return target


@dataclass
class Invocation:
    """One request's call: run it with :meth:`run`, encode what it returns with :meth:`encode`."""

    target: Callable
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    mode: str = "async"
    typed: bool = False  # a handle's call: answer with the codec
    stream_requested: bool = False  # a handle asked for a stream from a method that may return one
    name: str = "__call__"
    framing: str = "ndjson"  # set by stream_content_type: "sse", "typed", "raw" or "ndjson"
    #: The method's own name, as Ray's messages give it (``__call__``, ``unary``).
    method: str = "__call__"
    #: The stream the target returned already (a plain HTTP request's: see :meth:`outcome`).
    produced: Any = None
    #: ``produced`` is a Starlette response (an ASGI app) to send as it sends itself.
    responds: bool = False

    def run(self) -> Any:
        """Call the target: a coroutine, a value, an async iterator or a generator, by mode."""
        return self.target(*self.args, **self.kwargs)

    @property
    def streams(self) -> bool:
        return self.stream_requested or self.mode in ("stream", "sync_stream")

    async def items(self) -> AsyncIterator[Any]:
        """The streamed items: of a generator function, or of the generator a method returned."""
        if self.produced is not None:
            produced = self.produced
        elif self.mode in ("stream", "sync_stream"):
            produced = self.run()
        elif self.mode == "async":
            produced = await self.run()
        else:
            produced = await asyncio.to_thread(self.run)
        if hasattr(produced, "__aiter__"):
            async for item in produced:
                yield item
        elif inspect.isgenerator(produced):
            async for item in iterate_in_thread(produced):
                yield item
        else:
            raise remote_error_class("TypeError")(
                f"Called method '{self.method}' with `handle.options(stream=True)` but it did not return a "
                f"generator (it returned a {type(produced).__name__}).", error_type="TypeError")

    def outcome(self, value: Any) -> tuple[bytes, str] | Invocation:
        """What the handler returned, to send: encoded (:meth:`encode`), or, where a plain HTTP
        request's handler returned a stream (a generator, a ``@batch`` generator's stream), the
        invocation that streams it (as Ray streams it: an HTTP client cannot ask for a stream),
        or a Starlette response to send as it is (as Ray sends it)."""
        if not self.typed and is_starlette_response(value):
            return replace(self, produced=value, responds=True)
        if not self.typed and returns_stream(value):
            return replace(self, produced=value, stream_requested=True)
        return self.encode(value)

    def encode(self, value: Any) -> tuple[bytes, str]:
        """A unary answer as (body, content type); a value that cannot be sent is a handler error."""
        if returns_stream(value):
            raise generator_without_stream(self.method)
        try:
            if self.typed:
                return encode_value(value), VALUE_CONTENT_TYPE
            return encode_body(value)
        except TypeError as error:
            raise HandlerError(f"the handler returned what cannot be sent: {error}",
                               error_type="TypeError") from None

    def stream_content_type(self, first: Any, sse: bool) -> str:
        """The content type of the stream whose first item is ``first`` (it decides for the rest)."""
        if sse:
            self.framing = "sse"
            return "text/event-stream"
        if self.typed:
            self.framing = "typed"
            return STREAM_CONTENT_TYPE
        if isinstance(first, (bytes, bytearray, memoryview)):
            self.framing = "raw"
            return "application/octet-stream"
        if isinstance(first, str):
            self.framing = "raw"
            return "text/plain; charset=utf-8"
        self.framing = "ndjson"
        return "application/x-ndjson"

    def frame(self, chunk: Any, sse: bool) -> bytes:
        """One streamed item as bytes on the wire."""
        try:
            if self.typed and not sse:
                return encode_stream_item(chunk)
            if isinstance(chunk, (bytes, bytearray, memoryview)):
                data = bytes(chunk)
            elif isinstance(chunk, str):
                data = chunk.encode()
            else:
                data = to_json(chunk) if sse else to_json(chunk) + b"\n"  # NDJSON: one record a line
        except TypeError as error:
            raise HandlerError(f"the handler yielded what cannot be sent: {error}", error_type="TypeError") from None
        return b"data: " + data + b"\n\n" if sse else data

    def error_frame(self, error: ModelplexError, sse: bool) -> bytes:
        """The record that ends a stream that failed part way; none for raw text or bytes, where
        it would read as data (the cut connection is the signal there)."""
        if sse:
            return sse_error_frame(error)
        if self.typed:
            return encode_stream_error(error)
        if self.framing == "raw":
            return b""
        return ndjson_error_frame(error)


def returns_stream(value: Any) -> bool:
    """Whether a handler's answer is a stream to iterate rather than a value to send."""
    return inspect.isgenerator(value) or inspect.isasyncgen(value) or hasattr(value, "__aiter__")


def is_starlette_response(value: Any) -> bool:
    """Whether a handler's answer is a Starlette (or FastAPI) response: an ASGI app that sends
    its own status, headers and body. Starlette is not imported for the question: a response
    exists only where it was."""
    responses = sys.modules.get("starlette.responses")
    return responses is not None and isinstance(value, responses.Response)


def generator_without_stream(method: str) -> HandlerError:
    """A generator called through a handle without ``stream=True``: a ``TypeError`` worded as Ray's."""
    return remote_error_class("TypeError")(f"Method '{method}' returned a generator. You must use "
                                           "`handle.options(stream=True)` to call generators on a deployment.",
                                           error_type="TypeError")


def invocation(handler: Any, content_type: str, body: Any) -> Invocation:
    """The call a request makes: a handle's envelope (``body`` is its bytes), else ``__call__(body)``."""
    if content_type == CALL_CONTENT_TYPE:
        call = decode_call(body)
        target = method_of(handler, call.method)
        mode = call_mode(target)
        name = type(handler).__qualname__ + ("" if call.method == "__call__" else f".{call.method}")
        if mode in ("stream", "sync_stream") and not call.stream:
            raise generator_without_stream(call.method)
        # A method that is not a generator function may still return one: known once it ran.
        return Invocation(target, call.args, call.kwargs, mode, typed=True, stream_requested=call.stream, name=name,
                          method=call.method)
    whole_mode = _whole_call_mode(handler)
    if whole_mode is None:
        raise _no_call(handler)
    return Invocation(handler, (body,) if _takes_arguments(handler) else (), {}, whole_mode,
                      name=type(handler).__qualname__)


async def iterate_in_thread(generator: Generator[Any, Any, Any]) -> AsyncIterator[Any]:
    """A synchronous generator as an async iterator: each item is computed in a worker thread,
    so a generator that computes (a forward pass per chunk) streams without blocking a loop.

    Closing or cancelling the iterator lets the step in flight finish (a thread cannot be
    interrupted), then closes the generator, so its ``finally`` blocks run.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()  # the request's model id, in every step
    end = object()
    step = None
    try:
        while True:
            step = loop.run_in_executor(None, context.run, next, generator, end)  # type: ignore[arg-type]  # overloaded next()
            item = await asyncio.shield(step)
            step = None
            if item is end:
                return
            yield item
    finally:
        if step is not None:
            await asyncio.wait([step])
        await loop.run_in_executor(None, context.run, generator.close)
