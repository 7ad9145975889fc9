"""``@batch``: dynamic batching per model id, with Ray Serve's ``@serve.batch`` semantics.

Callers make single calls; the decorated function receives lists, and returns one result per
request in a list (or any sequence: a tensor with one row per request). A function of several
parameters gets one list per parameter (``f(key1, key2)`` called as ``f("a", key2="b")`` and
``f("c", "d")`` runs once as ``f(["a", "c"], ["b", "d"])``), whatever mix of positional and
keyword arguments the callers used.

A batch forms when ``max_batch_size`` requests wait (or, with ``batch_size_fn``, when the next
request would not fit), or ``batch_wait_timeout_s`` after the oldest waiting request arrived,
whichever comes first. Up to ``max_concurrent_batches`` batches run at once. Each model id has
its own queue, so batches never mix models and a batch for M is never held behind traffic for
other models. Results go back to their own callers; an exception fails only the callers of
that batch; a caller that goes away is dropped, and a batch whose callers all went away is
cancelled.

An async-generator function streams: it yields lists (one item per caller), and each caller
gets its own stream. Calling it joins the batch at once (the stream is read later). An item
that is ``StopIteration`` or ``StopAsyncIteration`` (the class or an instance) ends that
caller's stream early; an item that is an ``Exception`` fails just that caller.

Every queue's worker is a supervised task: if it fails (a ``batch_size_fn`` that raises, a
bug), the callers waiting in it get the error and the next call starts a new worker. Time is
the event loop's clock, so tests run it on a virtual one.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections import deque
from collections.abc import Coroutine, Generator, Mapping, Sized
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Callable, cast

from modelplex.context import get_multiplexed_model_id
from modelplex.runtime import current_runtime
from modelplex.wire.errors import BatchItemTooLarge, BatchSizeMismatch, HandlerError
from modelplex.wire.spec import DEFAULT_BATCH_WAIT_TIMEOUT_S, DEFAULT_MAX_BATCH_SIZE

log = logging.getLogger("modelplex.batching")

_QUEUES_ATTR = "__modelplex_batch_queues__"
#: Set on the wrapper of a batched async generator (it is a plain function: see ``_BatchedStream``).
STREAMING_ATTR = "__modelplex_batch_streaming__"
_END = object()
_STOP_TOKENS = (StopIteration, StopAsyncIteration)


# -- settings -------------------------------------------------------------------------------------


def _check_batch_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"max_batch_size must be integer >= 1, got {value}")
    if value != math.trunc(value):
        raise TypeError(f"max_batch_size must be integer >= 1, got {value}")
    if value < 1:
        raise ValueError(f"max_batch_size must be an integer >= 1, got {value}")
    return int(math.trunc(value))


def _check_timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"batch_wait_timeout_s must be a float >= 0, got {value}")
    if value < 0:
        raise ValueError(f"batch_wait_timeout_s must be a float >= 0, got {value}")
    return float(value)


def _check_concurrency(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_concurrent_batches must be an integer >= 1, got {value}")
    if value < 1:
        raise ValueError(f"max_concurrent_batches must be an integer >= 1, got {value}")
    return value


@dataclass
class _Settings:
    """One decorated function's settings. Precedence: a setter call, then the spec, then the decorator."""

    max_batch_size: int
    batch_wait_timeout_s: float
    max_concurrent_batches: int
    batch_size_fn: Callable[[list], int] | None
    size_set: bool = False
    timeout_set: bool = False
    #: (batch size, maxOngoingRequests) last warned about: one warning per setting, not per model's queue.
    warned: tuple[int, int] | None = None

    def batch_size(self) -> int:
        override = current_runtime().max_batch_size
        return self.max_batch_size if self.size_set or override is None else override

    def wait_timeout_s(self) -> float:
        override = current_runtime().batch_wait_timeout_s
        return self.batch_wait_timeout_s if self.timeout_set or override is None else override

    def warn_if_batches_cannot_fill(self, name: str) -> None:
        """Warn when the replica's ``maxOngoingRequests`` is below what full concurrent batches
        need: the replica never holds that many requests, so its batches never fill (and each
        waits out ``batch_wait_timeout_s``). Known only inside a replica; once per setting."""
        limit = current_runtime().max_ongoing_requests
        size = self.batch_size()
        if limit is None or size * self.max_concurrent_batches <= limit:
            self.warned = None
            return
        if self.warned == (size, limit):
            return
        self.warned = (size, limit)
        log.warning(
            "@batch %s: max_batch_size (%d) x max_concurrent_batches (%d) is larger than the replica's "
            "maxOngoingRequests (%d): the replica never holds enough requests to fill its batches. Raise "
            "maxOngoingRequests (max_ongoing_requests) to at least %d, or lower max_batch_size.",
            name, size, self.max_concurrent_batches, limit, size * self.max_concurrent_batches)


# -- one waiting call ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Pending:
    arguments: dict[str, Any]  # parameter name -> this caller's value
    arrived: float
    future: asyncio.Future | None = None  # unary callers
    stream: asyncio.Queue | None = None  # streaming callers
    gone: bool = False  # a streaming caller that stopped listening
    batch: _Batch | None = None

    @property
    def live(self) -> bool:
        if self.future is not None:
            return not self.future.done()
        return not self.gone

    def fail(self, error: BaseException) -> None:
        if self.future is not None:
            if not self.future.done():
                self.future.set_exception(error)
        elif not self.gone:
            self.send(error)

    def send(self, value: Any) -> None:
        """A streaming caller's next chunk, its end or its error."""
        if self.stream is not None:
            self.stream.put_nowait(value)


@dataclass(eq=False)
class _Batch:
    limit: int
    taken: asyncio.Future  # done once the batch has taken its requests from the queue
    items: list[_Pending] = field(default_factory=list)
    task: asyncio.Task | None = None

    def abandoned(self) -> bool:
        return not any(item.live for item in self.items)


# -- the queue of one (owner, model id) -------------------------------------------------------------


@dataclass(eq=False)
class _BatchQueue:
    """The waiting calls for one (instance or function, model id), and the worker that batches them."""

    call: Callable[[list[_Pending]], Any]  # runs one batch: a coroutine, or an async iterator of lists
    model_id: str
    settings: _Settings
    first_parameter: str | None
    streaming: bool
    on_idle: Callable[[_BatchQueue], None]
    pending: deque[_Pending] = field(default_factory=deque)
    running: set[_Batch] = field(default_factory=set)
    worker: asyncio.Task | None = None
    _wakeup: asyncio.Future | None = None

    def submit(self, item: _Pending) -> None:
        self.pending.append(item)
        self._wake()
        self._ensure_worker()

    def _ensure_worker(self) -> None:
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self._work(), name=f"batcher {self.model_id!r}")
            self.worker.add_done_callback(self._worker_ended)

    def caller_left(self, item: _Pending) -> None:
        """A caller went away: cancel its batch if nobody is left to receive the results."""
        batch = item.batch
        if batch is not None and batch.task is not None and not batch.task.done() and batch.abandoned():
            batch.task.cancel()
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _wait(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._wakeup = loop.create_future()
        timer = loop.call_later(timeout, _resolve, self._wakeup) if timeout is not None else None
        try:
            await self._wakeup
        finally:
            if timer is not None:
                timer.cancel()
            self._wakeup = None

    # -- the worker ----------------------------------------------------------------------------

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_gone()
            if not self.pending:
                return
            if len(self.running) >= self.settings.max_concurrent_batches:
                await self._wait(None)  # a running batch ends (or a caller leaves)
                continue
            # The settings in force when a batch starts forming are the ones it uses.
            limit, timeout = self.settings.batch_size(), self.settings.wait_timeout_s()
            while not self._full(limit) and self.pending:  # _full may fail an oversized request
                remaining = self.pending[0].arrived + timeout - loop.time()
                if remaining <= 0:
                    break
                await self._wait(remaining)
                self._drop_gone()
                if not self.pending:
                    break
            if self.pending:
                await self._start(limit, loop)

    def _worker_ended(self, worker: asyncio.Task) -> None:
        if self.worker is not worker:
            return  # a newer worker already took over
        self.worker = None
        error = None if worker.cancelled() else worker.exception()
        if worker.cancelled() or error is not None:
            # Nobody may wait for ever on a worker that is gone: fail its callers; the next
            # call starts a new worker.
            if error is not None:
                log.error("batcher for model %r failed", self.model_id, exc_info=error)
            failure = HandlerError(f"batching failed: {error!r}" if error is not None else "batcher stopped")
            while self.pending:
                self.pending.popleft().fail(failure)
        elif self.pending:
            self._ensure_worker()  # calls came between the worker's last look and its end
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if (self.worker is None or self.worker.done()) and not self.pending and not self.running:
            self.on_idle(self)

    def _drop_gone(self) -> None:
        if any(not item.live for item in self.pending):
            self.pending = deque(item for item in self.pending if item.live)

    def _size(self, items: list[_Pending]) -> int:
        size_fn = self.settings.batch_size_fn
        if size_fn is None:
            return len(items)
        values = [item.arguments[self.first_parameter] for item in items] if self.first_parameter else []
        return size_fn(values)

    def _full(self, limit: int) -> bool:
        if self.settings.batch_size_fn is None:
            return len(self.pending) >= limit
        self._fail_oversized(limit)
        fitting = self._fitting(limit)
        return len(fitting) < len(self.pending) or (bool(fitting) and self._size(fitting) >= limit)

    def _fail_oversized(self, limit: int) -> None:
        """Requests that could never fit in a batch fail now instead of blocking the queue."""
        kept: deque[_Pending] = deque()
        for item in self.pending:
            size = self._size([item])
            if size > limit:
                item.fail(BatchItemTooLarge(
                    f"a request of size {size} (by batch_size_fn) is larger than max_batch_size ({limit})"))
            else:
                kept.append(item)
        self.pending = kept

    def _fitting(self, limit: int) -> list[_Pending]:
        """The longest prefix of the waiting requests that fits within ``limit``."""
        if self.settings.batch_size_fn is None:
            return list(self.pending)[:limit]
        fitting: list[_Pending] = []
        for item in self.pending:
            if self._size([*fitting, item]) > limit:
                break
            fitting.append(item)
        return fitting

    def _take(self, limit: int) -> list[_Pending]:
        if self.settings.batch_size_fn is not None:
            self._fail_oversized(limit)
        batch = self._fitting(limit)
        for _ in batch:
            self.pending.popleft()
        return batch

    async def _start(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        """Start a batch of up to ``limit``, and return once it has taken its requests. It takes
        them when it begins to run, not now: requests that join in between (the loop serves
        others before the batch's task runs) ride along instead of waiting through it."""
        batch = _Batch(limit, loop.create_future())
        batch.task = loop.create_task(self._run(batch))
        self.running.add(batch)
        batch.task.add_done_callback(lambda _: self._batch_ended(batch))
        await batch.taken

    def _batch_ended(self, batch: _Batch) -> None:
        _resolve(batch.taken)  # cancelled before it ran: the worker goes on
        self.running.discard(batch)
        task = batch.task
        if task is not None and task.cancelled():
            for item in batch.items:
                item.fail(HandlerError("the batch was cancelled"))
        for item in batch.items:
            item.batch = None
        batch.items = []
        self._wake()
        self._maybe_idle()

    # -- running a batch ---------------------------------------------------------------------

    async def _run(self, batch: _Batch) -> None:
        self._drop_gone()  # callers may have left since the worker looked
        items = batch.items = self._take(batch.limit)
        _resolve(batch.taken)
        if not items:
            return
        for item in items:
            item.batch = batch
        _observe(self.model_id, len(items), asyncio.get_running_loop().time() - items[0].arrived)
        if self.streaming:
            await self._run_streaming(items)
            return
        try:
            results = await self.call(items)
            _check_length(results, items)
        except Exception as error:  # noqa: BLE001 - fails this batch's callers only
            for item in items:
                item.fail(error)
            return
        for item, result in zip(items, results):
            if not item.live or item.future is None:  # (a unary caller's future is always set)
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    async def _run_streaming(self, items: list[_Pending]) -> None:
        open_items = set(range(len(items)))
        outputs_of = self.call(items)
        try:
            async for outputs in outputs_of:
                _check_length(outputs, items)
                for index in sorted(open_items):
                    item, output = items[index], outputs[index]
                    # By identity: ``in`` would compare with ==, which an array or tensor answers elementwise.
                    if any(output is token for token in _STOP_TOKENS) or isinstance(output, _STOP_TOKENS):
                        item.send(_END)
                        open_items.discard(index)
                    elif isinstance(output, BaseException):
                        item.send(output)
                        open_items.discard(index)
                    elif item.live:
                        item.send(output)
                if not any(items[i].live for i in open_items):
                    break  # every caller left or ended: stop producing
        except Exception as error:  # noqa: BLE001 - every open stream hears about it
            for index in open_items:
                items[index].fail(error)
            return
        finally:
            await outputs_of.aclose()
        for index in open_items:
            if items[index].live:
                items[index].send(_END)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _observe(model_id: str, size: int, waited_s: float) -> None:
    try:
        current_runtime().batch_done(model_id, size, waited_s)
    except Exception:  # noqa: BLE001 - a metrics hook must never strand a batch's callers
        log.exception("a batch observer failed")


def _check_length(results: Any, items: list[_Pending]) -> None:
    """One result per request, in a list or any other sequence (a tensor or an array whose first
    dimension is the batch, as a model returns it)."""
    if isinstance(results, (str, bytes, Mapping)) or not isinstance(results, Sized) \
            or not hasattr(results, "__getitem__"):
        raise TypeError(f"a batched function returns a list of one result per request; it returned "
                        f"{type(results).__name__} for a batch of {len(items)}")
    if len(results) != len(items):
        raise BatchSizeMismatch(len(items), len(results))


# -- the caller's side of a batched generator -------------------------------------------------------


class _BatchedStream:
    """What calling a batched async generator returns: it has joined its batch already."""

    def __init__(self, join: Callable[[], tuple[_BatchQueue, _Pending]]):
        self._join = join
        self._queue: _BatchQueue | None = None
        self._item: _Pending | None = None
        self._done = False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: join at the first __anext__
        self._queue, self._item = join()

    def __aiter__(self) -> _BatchedStream:
        return self

    def __anext__(self) -> _Read:
        return _Read(self, self._next())

    async def _next(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        if self._item is None:
            self._queue, self._item = self._join()
        try:
            chunk = await cast("asyncio.Queue[Any]", self._item.stream).get()  # a streaming caller's: set
        except BaseException:
            self._leave()
            raise
        if chunk is _END:
            self._leave()
            raise StopAsyncIteration
        if isinstance(chunk, BaseException):
            self._leave()
            raise chunk
        return chunk

    async def aclose(self) -> None:
        self._leave()

    def _leave(self) -> None:
        self._done = True
        if self._item is not None and self._queue is not None and not self._item.gone:
            self._item.gone = True
            self._queue.caller_left(self._item)

    def __del__(self) -> None:
        if self._item is not None and not self._item.gone:
            self._item.gone = True  # never read to the end: stop producing for it


class _Read(Coroutine):
    """One ``__anext__`` of a batched stream. A task cancelled before its first step never runs
    its coroutine's code (it is thrown into, unstarted), so the read's own ``except`` could not
    let the caller go: this coroutine does, and its batch does not wait for a caller who left."""

    __slots__ = ("_stream", "_inner", "_started")

    def __init__(self, stream: _BatchedStream, inner: Coroutine):
        self._stream = stream
        self._inner = inner
        self._started = False

    def __await__(self) -> Generator[Any, None, Any]:
        self._started = True
        return self._inner.__await__()

    def send(self, value: Any) -> Any:
        self._started = True
        return self._inner.send(value)

    def throw(self, *error: Any) -> Any:
        self._given_up()
        return self._inner.throw(*error)

    def close(self) -> None:
        self._given_up()
        self._inner.close()

    def _given_up(self) -> None:
        if not self._started:
            self._started = True
            self._stream._leave()


# -- the decorator -------------------------------------------------------------------------------------


def batch(
    _func: Callable | None = None,
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S,
    max_concurrent_batches: int = 1,
    batch_size_fn: Callable[[list], int] | None = None,
):
    """Batch calls to an async function (or async generator) that takes and returns lists.

    ``max_batch_size``: the most requests in a batch (with ``batch_size_fn``, the most total
    size). ``batch_wait_timeout_s``: how long the oldest waiting request waits for more.
    ``max_concurrent_batches``: batches of one model that may run at once.
    ``batch_size_fn(values) -> int``: the size of a batch from its first parameter's values
    (e.g. the sum of token counts) instead of the number of requests.

    The wrapper has ``set_max_batch_size``, ``set_batch_wait_timeout_s`` and their getters
    ``_get_max_batch_size`` / ``_get_batch_wait_timeout_s``; a new value applies from the
    next batch. The spec's ``batching.maxBatchSize`` and ``batching.batchWaitTimeoutMs``
    override the decorator's arguments (a setter call overrides both). Works on methods
    (queues per instance) and plain functions.
    """
    settings = _Settings(
        max_batch_size=_check_batch_size(max_batch_size),
        batch_wait_timeout_s=_check_timeout(batch_wait_timeout_s),
        max_concurrent_batches=_check_concurrency(max_concurrent_batches),
        batch_size_fn=batch_size_fn,
    )
    if batch_size_fn is not None and not callable(batch_size_fn):
        raise TypeError(f"batch_size_fn must be a callable or None, got {type(batch_size_fn)}")

    def wrap(handler: Callable) -> Callable:
        wrapper = _wrap(handler, settings)
        settings.warn_if_batches_cannot_fill(handler.__qualname__)
        return wrapper

    return wrap(_func) if _func is not None else wrap


def _wrap(handler: Callable, settings: _Settings) -> Callable:
    streaming = inspect.isasyncgenfunction(handler)
    if not streaming and not inspect.iscoroutinefunction(handler):
        name = getattr(handler, "__qualname__", repr(handler))
        raise TypeError(f"@batch needs an `async def` function or async generator; {name} is neither")
    parameters = list(inspect.signature(handler).parameters.values())
    takes_self = bool(parameters) and parameters[0].name == "self"
    if takes_self:
        parameters = parameters[1:]
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"@batch cannot batch {handler.__qualname__}'s *args or **kwargs: name each parameter")
    signature = inspect.Signature(parameters)
    positional = [p.name for p in parameters if p.kind != p.KEYWORD_ONLY]
    keyword_only = [p.name for p in parameters if p.kind == p.KEYWORD_ONLY]
    first_parameter = parameters[0].name if parameters else None

    def call_batch(owner: Any, items: list[_Pending]) -> Any:
        args = [[item.arguments[name] for item in items] for name in positional]
        kwargs = {name: [item.arguments[name] for item in items] for name in keyword_only}
        if takes_self:
            return handler(owner, *args, **kwargs)
        return handler(*args, **kwargs)

    def join(args: tuple, kwargs: dict) -> tuple[_BatchQueue, _Pending]:
        owner, args = (args[0], args[1:]) if takes_self else (wrapper, args)
        if not kwargs and len(args) == len(positional) and not keyword_only:
            arguments = dict(zip(positional, args))  # the usual call: what bind would give, cheaper
        else:
            bound = signature.bind(*args, **kwargs)  # a wrong call fails here, in its caller
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        loop = asyncio.get_running_loop()
        if streaming:
            item = _Pending(arguments, loop.time(), stream=asyncio.Queue())
        else:
            item = _Pending(arguments, loop.time(), future=loop.create_future())
        queue = _queue_for(owner, handler.__qualname__, settings, lambda model_id, on_idle: _BatchQueue(
            call=functools.partial(call_batch, owner),
            model_id=model_id,
            settings=settings,
            first_parameter=first_parameter,
            streaming=streaming,
            on_idle=on_idle,
        ))
        queue.submit(item)
        if item.future is not None:
            def left(future: asyncio.Future[Any]) -> None:
                if future.cancelled():
                    queue.caller_left(item)

            item.future.add_done_callback(left)
        return queue, item

    if streaming:

        @functools.wraps(handler)
        def wrapper(*args: Any, **kwargs: Any) -> _BatchedStream:
            return _BatchedStream(lambda: join(args, kwargs))

        setattr(wrapper, STREAMING_ATTR, True)
    else:

        @functools.wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            _, item = join(args, kwargs)
            return await cast("asyncio.Future[Any]", item.future)  # a unary caller's: set

    def set_max_batch_size(value: int) -> None:
        settings.max_batch_size, settings.size_set = _check_batch_size(value), True
        settings.warn_if_batches_cannot_fill(handler.__qualname__)

    def set_batch_wait_timeout_s(value: float) -> None:
        settings.batch_wait_timeout_s, settings.timeout_set = _check_timeout(value), True

    setattr(wrapper, "set_max_batch_size", set_max_batch_size)
    setattr(wrapper, "set_batch_wait_timeout_s", set_batch_wait_timeout_s)
    setattr(wrapper, "_get_max_batch_size", settings.batch_size)
    setattr(wrapper, "_get_batch_wait_timeout_s", settings.wait_timeout_s)
    return wrapper


def _queue_for(owner: Any, name: str, settings: _Settings,
               create: Callable[[str, Callable], _BatchQueue]) -> _BatchQueue:
    """The queue of ``owner``'s batched ``name`` for the current model id; an idle queue is dropped."""
    model_id = get_multiplexed_model_id()
    queues = owner.__dict__.setdefault(_QUEUES_ATTR, {}).setdefault(name, {})
    queue = queues.get(model_id)
    if queue is None:
        settings.warn_if_batches_cannot_fill(name)  # the replica's limits are known by the first call
        queue = queues[model_id] = create(model_id, lambda idle: queues.get(model_id) is idle and queues.pop(model_id))
    return queue
