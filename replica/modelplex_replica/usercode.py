"""The user-code event loop: handlers, model loaders and batchers run here, off the server loop.

An ``async def`` handler that computes (a torch forward pass, as users write them) holds the
loop it runs on. On the server's loop that would stall ``/readyz``, ``/v1/models`` and
``/metrics`` behind it, and a busy replica would look dead to its router and its kubelet. As in
Ray Serve, user code gets a thread and an event loop of its own; the server loop only does I/O
and hands work over: one hop there and one back per request, one hop per streamed chunk.

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
from typing import Any, AsyncIterator, Callable, Coroutine, TypeVar

log = logging.getLogger("modelplex.replica")

T = TypeVar("T")

#: How much lower than the server loop's the CPU priority of user code is (Linux niceness).
USER_CODE_NICENESS = 10

#: Chunks a stream's producer may run ahead of the client: enough to keep the user loop busy
#: while the server loop writes, few enough that backpressure still reaches the generator.
STREAM_WINDOW = 4


class UserCodeLoop:
    """An event loop in its own thread; :meth:`run` awaits a coroutine on it from another loop."""

    def __init__(self, name: str = "modelplex-user-code"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

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

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The result of ``coroutine``, run on the user loop; cancelling the caller cancels it there."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stream(self, open_stream: Callable[[], AsyncIterator[Any]], *, window: int = STREAM_WINDOW) -> Stream:
        """Iterate ``open_stream()`` on the user loop; read its items from the calling loop."""
        return Stream(self, open_stream, asyncio.get_running_loop(), window)

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

    The producer runs at most ``window`` chunks ahead of the reader. Each chunk costs one
    wake-up of the reader's loop; the reader wakes the producer only when it had to wait.
    :meth:`aclose` (or the reader's cancellation) cancels the producer, which closes the
    generator on its own loop.
    """

    def __init__(self, user: UserCodeLoop, open_stream: Callable[[], AsyncIterator[Any]],
                 reader_loop: asyncio.AbstractEventLoop, window: int):
        self._reader_loop = reader_loop
        self._user_loop = user.loop
        self._window = window
        self._items: collections.deque[tuple[int, Any]] = collections.deque()
        self._arrived = asyncio.Event()  # used on the reader's loop only
        self._space = asyncio.Event()  # used on the user loop only
        self._sent = 0  # written by the producer only
        self._taken = 0  # written by the reader only
        self._producer_waits = False
        self._producer = asyncio.run_coroutine_threadsafe(self._produce(open_stream), user.loop)

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
                self._producer.cancel()
                raise
        kind, value = self._items.popleft()
        if kind == _CHUNK:
            self._taken += 1
            if self._producer_waits:
                self._user_loop.call_soon_threadsafe(self._space.set)
            return value
        if kind == _END:
            raise StopAsyncIteration
        raise value

    async def aclose(self) -> None:
        """Stop the producer (and so the generator) if it still runs."""
        self._producer.cancel()

    # -- the producer, on the user loop ------------------------------------------------------

    def _deliver(self, item: tuple[int, Any]) -> None:
        self._items.append(item)
        self._arrived.set()

    def _push(self, kind: int, value: Any) -> None:
        self._reader_loop.call_soon_threadsafe(self._deliver, (kind, value))

    async def _produce(self, open_stream: Callable[[], AsyncIterator[Any]]) -> None:
        iterator = None
        try:
            iterator = open_stream().__aiter__()
            async for chunk in iterator:
                self._sent += 1
                self._push(_CHUNK, chunk)
                await self._wait_for_space()
            self._push(_END, None)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the reader raises it
            self._push(_ERROR, error)
        finally:
            if iterator is not None and hasattr(iterator, "aclose"):
                await iterator.aclose()

    async def _wait_for_space(self) -> None:
        while self._sent - self._taken >= self._window:
            self._space.clear()
            self._producer_waits = True
            # The reader may have taken one between the check and the flag: look once more.
            if self._sent - self._taken < self._window:
                self._producer_waits = False
                return
            try:
                await self._space.wait()
            finally:
                self._producer_waits = False
