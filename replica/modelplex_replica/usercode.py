"""The user-code event loop: handlers, model loaders and batchers run here, off the server loop.

An ``async def`` handler that computes (a torch forward pass, as users write them) holds the
loop it runs on. On the server's loop that would stall ``/readyz``, ``/v1/models`` and
``/metrics`` behind it, and a busy replica would look dead to its router and its kubelet. As in
Ray Serve, user code gets a thread and an event loop (uvloop's) of its own. Connections that
open with an invoke (a router's) are served on the user loop itself (``handoff.py``): their
requests call user code directly. What arrives on the server loop (model loads, metadata, an
invoke on a connection that began with something else, and every request of an in-process test
server) hops: :meth:`UserCodeLoop.run` there and one back, one hop per streamed chunk.

Hops are cheap because they travel in bulk: each direction has a :class:`Mailbox`, and a burst
of hops (a batch's 32 answers, the requests that arrived while a batch computed) costs one
wake-up of the other loop, not one each. Waking a loop writes to its self-pipe, which releases
the GIL to the other thread; per hop, that hand-over dominated the cost of a batched request.

Two threads share one GIL. The interpreter's switch interval stays at its default (5 ms):
a shorter one (0.5 ms was tried) lets user code take the GIL back sooner between torch ops,
but each forced hand-over costs both threads futex calls and a context switch, and under
batched load they cost more than they saved (10.6 against 5.1 futex calls per request, and
about 7% of batched throughput: bench/results/busy-replicas).

A thread of its own is not enough on a machine whose cores the model saturates (torch starts
one compute thread per core): the server thread would wait for a core behind them. So user
code runs at a lower CPU priority (niceness :data:`USER_CODE_NICENESS`, per thread, inherited
by the threads it starts, torch's among them): the control path always gets a core first,
and user code still has every idle cycle.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from typing import Any, AsyncIterator, Callable, Coroutine, TypeVar

import uvloop

log = logging.getLogger("modelplex.replica")

T = TypeVar("T")

#: How much lower than the server loop's the CPU priority of user code is (Linux niceness).
USER_CODE_NICENESS = 10

#: Chunks a stream's producer may run ahead of the client: enough to keep the user loop busy
#: while the server loop writes, few enough that backpressure still reaches the generator.
STREAM_WINDOW = 4

#: Posts to a caller's loop within this long of its last wake-up ride with the next one.
COALESCE_S = 0.002


class Mailbox:
    """Calls handed to one event loop from other threads, run there in order, in bulk.

    The first call of a burst schedules the drain (one ``call_soon_threadsafe``, one write to
    the loop's self-pipe); the calls posted before the drain runs ride along with it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._calls: collections.deque[tuple[Callable[..., Any], tuple]] = collections.deque()
        self._scheduled = False

    def post(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback(*args)`` on the mailbox's loop, soon (from any thread)."""
        self._calls.append((callback, args))
        if not self._scheduled:
            self._scheduled = True
            # Cleared by the drain before it empties the deque: a call appended after that
            # point either sees False and schedules a drain, or is taken by this one.
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        calls = self._calls
        while calls:
            callback, args = calls.popleft()
            try:
                callback(*args)
            except Exception as error:  # noqa: BLE001 - one failed call must not strand the rest
                self.loop.call_exception_handler({"message": "mailbox call failed", "exception": error})


class Outbox(Mailbox):
    """The user loop's mailbox to a caller's loop: answers and stream chunks, posted from the user loop.

    A post wakes the caller's loop at once, unless it woke it less than :data:`COALESCE_S`
    ago: then the post waits for the end of the user loop's current round of callbacks. A
    batch's answers, which complete together, so cost two wake-ups rather than one each (a
    woken server thread takes the GIL from the user thread, and would otherwise do so for
    every answer); an answer that completes alone still leaves at once.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sender: asyncio.AbstractEventLoop):
        super().__init__(loop)
        self._sender = sender
        self._woke_at = float("-inf")
        self._flush_pending = False

    def post(self, callback: Callable[..., Any], *args: Any) -> None:
        self._calls.append((callback, args))
        if self._scheduled:
            return
        now = time.monotonic()
        if now - self._woke_at >= COALESCE_S:
            self._wake(now)
        elif not self._flush_pending:
            self._flush_pending = True
            self._sender.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if self._calls and not self._scheduled:
            self._wake(time.monotonic())

    def _wake(self, now: float) -> None:
        self._woke_at = now
        self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)


class _Job:
    """One :meth:`UserCodeLoop.run`: the coroutine, its task on the user loop, the caller's future."""

    __slots__ = ("coroutine", "reply", "replies", "task", "cancelled")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], reply: asyncio.Future, replies: Mailbox):
        self.coroutine = coroutine
        self.reply = reply
        self.replies = replies  # the caller's loop's mailbox
        self.task: asyncio.Task | None = None
        self.cancelled = False


class UserCodeLoop:
    """An event loop in its own thread; :meth:`run` awaits a coroutine on it from another loop."""

    def __init__(self, name: str = "modelplex-user-code"):
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()  # it serves invoke connections too
        self.inbox = Mailbox(self.loop)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._outboxes: dict[asyncio.AbstractEventLoop, Outbox] = {}

    def start(self) -> None:
        """Start the loop; called from the server's thread, which keeps its priority."""
        server = threading.get_native_id()
        # Threads that exist already were started by the handler's construction (torch's
        # compute pool, for one): they are user code too.
        for thread_id in _thread_ids():
            if thread_id != server:
                _lower_priority(thread_id)
        self._thread.start()

    def _serve(self) -> None:
        _lower_priority(threading.get_native_id())  # inherited by every thread user code starts
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def outbox(self, loop: asyncio.AbstractEventLoop) -> Outbox:
        """The mailbox of ``loop`` (a caller's), where the user loop sends answers."""
        box = self._outboxes.get(loop)
        if box is None:
            box = self._outboxes.setdefault(loop, Outbox(loop, self.loop))
        return box

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The result of ``coroutine``, run on the user loop; cancelling the caller cancels it there."""
        caller = asyncio.get_running_loop()
        if caller is self.loop:  # a request served on the user loop itself (handoff.py): no hop
            return await coroutine
        job = _Job(coroutine, caller.create_future(), self.outbox(caller))
        self.inbox.post(_start, job)
        try:
            return await job.reply
        except asyncio.CancelledError:
            self.inbox.post(_cancel, job)
            raise
        finally:
            del job  # see _run_job

    def stream(self, open_stream: Callable[[], AsyncIterator[Any]], *,
               window: int = STREAM_WINDOW) -> Stream | TakingTurns:
        """Iterate ``open_stream()`` on the user loop; read its items from the calling loop."""
        reader = asyncio.get_running_loop()
        if reader is self.loop:
            return TakingTurns(open_stream)
        return Stream(self, open_stream, reader, window)

    async def stop(self, timeout: float = 10.0) -> None:
        """Cancel what still runs there, then end the thread."""
        if not self._thread.is_alive():
            return
        try:
            await asyncio.wait_for(self.run(_cancel_all()), timeout)
        except (TimeoutError, RuntimeError):
            log.warning("user code did not stop within %g s", timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, timeout)


# -- the two ends of a hop: _start and _cancel on the user loop, _reply on the caller's ---------


def _start(job: _Job) -> None:
    if job.cancelled:
        job.coroutine.close()
        return
    job.task = asyncio.get_running_loop().create_task(_run_job(job))


async def _run_job(job: _Job) -> None:
    # The answer is posted as the coroutine ends, not from a done callback a round later: a
    # batch's answers then leave before the next batch's forward pass starts.
    try:
        result = await job.coroutine
    except asyncio.CancelledError:
        job.replies.post(_cancel_reply, job.reply)
        raise
    except BaseException as error:  # noqa: BLE001 - the caller raises it
        job.replies.post(_fail_reply, job.reply, error)
        if not isinstance(error, Exception):
            raise  # SystemExit, KeyboardInterrupt: the user loop's too
    else:
        job.replies.post(_reply, job.reply, result)
    finally:
        # The reply holds the error, whose traceback holds this frame: were the frame to hold
        # the reply too, the cycle would keep the user's frames, and the async generators they
        # hold open, alive until the cycle collector runs (minutes, maybe), not closed at once.
        del job


def _cancel(job: _Job) -> None:
    job.cancelled = True
    if job.task is not None:
        job.task.cancel()


def _reply(reply: asyncio.Future, result: Any) -> None:
    if not reply.done():  # done: the caller was cancelled
        reply.set_result(result)


def _fail_reply(reply: asyncio.Future, error: BaseException) -> None:
    if not reply.done():
        reply.set_exception(error)


def _cancel_reply(reply: asyncio.Future) -> None:
    reply.cancel()


def _thread_ids() -> list[int]:
    try:
        return [int(entry.name) for entry in os.scandir("/proc/self/task")]
    except OSError:  # not Linux
        return []


def _lower_priority(thread_id: int) -> None:
    try:
        current = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(19, current + USER_CODE_NICENESS))
    except OSError as error:  # a thread that just ended, or no permission: not worth failing for
        log.debug("could not lower the priority of thread %d: %s", thread_id, error)


async def _cancel_all() -> None:
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


_CHUNK, _END, _ERROR = range(3)


class Stream:
    """One stream handed from a producer task on the user loop to a reader on another loop.

    The producer runs at most ``window`` chunks ahead of the reader, and yields the user loop
    after every chunk: generators that compute (and so never await) take turns chunk by
    chunk, and a new stream's first chunk waits for one chunk of each running stream, not for
    their whole windows. Chunks and wake-ups travel through the loops' mailboxes; the reader
    wakes the producer only when it had to wait. :meth:`aclose` (or the reader's
    cancellation) cancels the producer, which closes the generator on its own loop.
    """

    def __init__(self, user: UserCodeLoop, open_stream: Callable[[], AsyncIterator[Any]],
                 reader_loop: asyncio.AbstractEventLoop, window: int):
        self._outbox = user.outbox(reader_loop)
        self._inbox = user.inbox
        self._window = window
        self._items: collections.deque[tuple[int, Any]] = collections.deque()
        self._arrived = asyncio.Event()  # used on the reader's loop only
        self._space: asyncio.Event | None = None  # used on the user loop only
        self._sent = 0  # written by the producer only
        self._taken = 0  # written by the reader only
        self._producer_waits = False
        self._producer: asyncio.Task | None = None
        self._closed = False
        self._inbox.post(self._start, open_stream)

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            self._arrived.clear()
            if self._items:
                break
            try:
                await self._arrived.wait()
            except asyncio.CancelledError:
                self._close()
                raise
        kind, value = self._items.popleft()
        if kind == _CHUNK:
            self._taken += 1
            if self._producer_waits:
                self._inbox.post(self._wake_producer)
            return value
        if kind == _END:
            raise StopAsyncIteration
        try:
            raise value
        finally:
            del value  # no cycle through the error's traceback (see _run_job)

    async def aclose(self) -> None:
        """Stop the producer (and so the generator) if it still runs."""
        self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._inbox.post(self._stop)

    # -- the producer, on the user loop ------------------------------------------------------

    def _start(self, open_stream: Callable[[], AsyncIterator[Any]]) -> None:
        if not self._closed:
            self._space = asyncio.Event()
            self._producer = asyncio.get_running_loop().create_task(self._produce(open_stream))

    def _stop(self) -> None:
        # Let go of the task: its cancellation's traceback holds the producer's frames, and so
        # this stream (a cycle) and what the generator held (see _run_job).
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.cancel()

    def _wake_producer(self) -> None:
        if self._space is not None:
            self._space.set()

    def _deliver(self, item: tuple[int, Any]) -> None:
        self._items.append(item)
        self._arrived.set()

    def _push(self, kind: int, value: Any) -> None:
        self._outbox.post(self._deliver, (kind, value))

    async def _produce(self, open_stream: Callable[[], AsyncIterator[Any]]) -> None:
        iterator = None
        try:
            iterator = open_stream().__aiter__()
            async for chunk in iterator:
                self._sent += 1
                self._push(_CHUNK, chunk)
                if not await self._wait_for_space():
                    await asyncio.sleep(0)  # the other streams' turn
            self._push(_END, None)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the reader raises it
            self._push(_ERROR, error)
        finally:
            if iterator is not None and hasattr(iterator, "aclose"):
                await iterator.aclose()

    async def _wait_for_space(self) -> bool:
        """Wait while the window is full; whether the producer had to (and so yielded the loop)."""
        waited = False
        space = self._space
        if space is None:  # set by _start, before the producer runs
            return False
        while self._sent - self._taken >= self._window:
            space.clear()
            self._producer_waits = True
            # The reader may have taken one between the check and the flag: look once more.
            if self._sent - self._taken < self._window:
                self._producer_waits = False
                break
            waited = True
            try:
                await space.wait()
            finally:
                self._producer_waits = False
        return waited


class TakingTurns:
    """A stream read on the user loop itself (no hop): before each item after the first, the
    loop goes round once, so generators that compute (and never await) take turns chunk by
    chunk with each other and with new requests, as :class:`Stream`'s producers do."""

    def __init__(self, open_stream: Callable[[], AsyncIterator[Any]]):
        self._open: Callable[[], AsyncIterator[Any]] | None = open_stream
        self._iterator: AsyncIterator[Any] | None = None

    def __aiter__(self) -> TakingTurns:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is not None:
            await asyncio.sleep(0)  # the other streams' turn
        elif self._open is not None:
            self._iterator, self._open = self._open().__aiter__(), None
        else:
            raise StopAsyncIteration  # closed
        return await self._iterator.__anext__()

    async def aclose(self) -> None:
        """Close the generator (its ``finally`` blocks run) if it was opened."""
        iterator, self._iterator, self._open = self._iterator, None, None
        if iterator is not None and hasattr(iterator, "aclose"):
            await iterator.aclose()
