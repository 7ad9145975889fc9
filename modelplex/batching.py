"""``@batch``: dynamic batching per model id.

Callers send one request each; a batch forms when ``max_batch_size`` requests wait or
``batch_wait_timeout_s`` after the first one arrived, whichever comes first. Each model id
has its own queue, so batches never mix models and a batch for M is never held behind
traffic for other models. Results go back to their own callers; an exception fails only the
callers of that batch; a caller that goes away is dropped without disturbing the others.

An async-generator handler streams: it yields lists (one item per caller), and each caller
gets its own stream. An item that is ``StopIteration`` (the class or an instance) ends that
caller's stream early; an item that is an ``Exception`` fails just that caller.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from modelplex.context import get_multiplexed_model_id, reset_multiplexed_model_id, set_multiplexed_model_id
from modelplex.errors import HandlerError
from modelplex.runtime import runtime
from modelplex.spec import DEFAULT_BATCH_WAIT_TIMEOUT_S, DEFAULT_MAX_BATCH_SIZE

_QUEUES_ATTR = "__modelplex_batch_queues__"
_END = object()


@dataclass(eq=False)
class _Pending:
    request: Any
    arrived: float
    future: asyncio.Future | None = None  # unary callers
    stream: asyncio.Queue | None = None  # streaming callers
    gone: bool = False  # a streaming caller that stopped listening

    @property
    def live(self) -> bool:
        if self.future is not None:
            return not self.future.done()
        return not self.gone


@dataclass(eq=False)
class _BatchQueue:
    """The waiting requests for one (handler, model id), and the worker that batches them."""

    func: Callable
    model_id: str
    max_batch_size: int
    timeout_s: float
    streaming: bool
    on_empty: Callable[[str], None]
    pending: deque[_Pending] = field(default_factory=deque)
    running: bool = False
    _wakeup: asyncio.Future | None = None

    def submit(self, item: _Pending) -> None:
        self.pending.append(item)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        if not self.running:
            self.running = True
            asyncio.ensure_future(self._work())

    async def _work(self) -> None:
        token = set_multiplexed_model_id(self.model_id)
        try:
            while True:
                batch = await self._collect()
                if not batch:
                    if not self.pending:
                        break
                    continue
                await self._run(batch)
        finally:
            reset_multiplexed_model_id(token)
            self.running = False
            if not self.pending:
                self.on_empty(self.model_id)

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        self._drop_gone()
        if not self.pending:
            return []
        deadline = self.pending[0].arrived + self.timeout_s
        while len(self.pending) < self.max_batch_size:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._wakeup = loop.create_future()
            timer = loop.call_later(remaining, _resolve, self._wakeup)
            try:
                await self._wakeup
            finally:
                timer.cancel()
                self._wakeup = None
            self._drop_gone()
            if not self.pending:
                return []
        batch = []
        while self.pending and len(batch) < self.max_batch_size:
            item = self.pending.popleft()
            if item.live:
                batch.append(item)
        if batch:
            runtime.batch_done(self.model_id, len(batch), loop.time() - batch[0].arrived)
        return batch

    def _drop_gone(self) -> None:
        while self.pending and not self.pending[0].live:
            self.pending.popleft()

    async def _run(self, batch: list[_Pending]) -> None:
        requests = [item.request for item in batch]
        if self.streaming:
            await self._run_streaming(batch, requests)
            return
        try:
            results = await self.func(requests)
            _check_length(results, batch)
        except Exception as error:  # noqa: BLE001 - fails this batch's callers only
            for item in batch:
                if item.live:
                    item.future.set_exception(error)
            return
        for item, result in zip(batch, results):
            if not item.live:
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    async def _run_streaming(self, batch: list[_Pending], requests: list[Any]) -> None:
        open_items = set(range(len(batch)))
        try:
            async for outputs in self.func(requests):
                _check_length(outputs, batch)
                for index in list(open_items):
                    item, output = batch[index], outputs[index]
                    if output is StopIteration or isinstance(output, StopIteration):
                        item.stream.put_nowait(_END)
                        open_items.discard(index)
                    elif isinstance(output, BaseException):
                        item.stream.put_nowait(output)
                        open_items.discard(index)
                    elif item.live:
                        item.stream.put_nowait(output)
                if not any(batch[i].live for i in open_items):
                    break  # every caller left: stop producing
        except Exception as error:  # noqa: BLE001
            for index in open_items:
                batch[index].stream.put_nowait(error)
            return
        for index in open_items:
            batch[index].stream.put_nowait(_END)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _check_length(results: Any, batch: list[_Pending]) -> None:
    if not isinstance(results, (list, tuple)) or len(results) != len(batch):
        got = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
        raise HandlerError(f"batched handler returned {got} results for a batch of {len(batch)}")


def batch(
    func: Callable | None = None,
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S,
):
    """Batch calls to an async ``func(requests: list) -> list`` (or an async generator of lists).

    The spec's ``batching.maxBatchSize`` and ``batching.batchWaitTimeoutMs`` override the
    arguments. Works on methods (queues per instance) and plain functions.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 (got {max_batch_size})")
    if batch_wait_timeout_s < 0:
        raise ValueError(f"batch_wait_timeout_s must be >= 0 (got {batch_wait_timeout_s})")

    def wrap(handler: Callable) -> Callable:
        streaming = inspect.isasyncgenfunction(handler)
        if not streaming and not inspect.iscoroutinefunction(handler):
            raise TypeError(f"@batch needs an async function or async generator; {handler.__qualname__} is neither")
        takes_self = "self" in inspect.signature(handler).parameters

        def queue_for(args: tuple) -> _BatchQueue:
            owner = args[0] if takes_self else handler
            queues = _queues(owner, handler.__name__)
            model_id = get_multiplexed_model_id()
            queue = queues.get(model_id)
            if queue is None:
                bound = functools.partial(handler, owner) if takes_self else handler
                timeout = runtime.batch_wait_timeout_s
                queue = _BatchQueue(
                    func=bound,
                    model_id=model_id,
                    max_batch_size=runtime.max_batch_size or max_batch_size,
                    timeout_s=batch_wait_timeout_s if timeout is None else timeout,
                    streaming=streaming,
                    on_empty=lambda mid: queues.pop(mid, None),
                )
                queues[model_id] = queue
            return queue

        if streaming:

            @functools.wraps(handler)
            async def call_streaming(*args: Any) -> AsyncIterator[Any]:
                loop = asyncio.get_running_loop()
                item = _Pending(args[-1], loop.time(), stream=asyncio.Queue())
                queue_for(args).submit(item)
                try:
                    while True:
                        chunk = await item.stream.get()
                        if chunk is _END:
                            return
                        if isinstance(chunk, BaseException):
                            raise chunk
                        yield chunk
                finally:
                    item.gone = True

            return call_streaming

        @functools.wraps(handler)
        async def call(*args: Any) -> Any:
            loop = asyncio.get_running_loop()
            item = _Pending(args[-1], loop.time(), future=loop.create_future())
            queue_for(args).submit(item)
            return await item.future

        return call

    return wrap(func) if func is not None else wrap


def _queues(owner: Any, name: str) -> dict[str, _BatchQueue]:
    return owner.__dict__.setdefault(_QUEUES_ATTR, {}).setdefault(name, {})
