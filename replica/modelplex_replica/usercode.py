"""The user-code event loop: the replica's API port, its handlers, model loaders and batchers run here.

An ``async def`` handler that computes (a torch forward pass, as users write them) holds the
loop it runs on. So a replica process has two: the server loop (the main thread) answers the
control port (health, readiness, metrics: :mod:`modelplex_replica.control`) and never runs user
code; the user loop (this module's thread) serves the API port, where every request runs user
code in its own task, without a hop between threads. A replica computing for its users still
answers its kubelet at once, and its requests cost no thread hand-over (a hop each way cost
~10% of batched throughput: bench/results/house-2026-11-27.md).

A thread of its own is not enough on a machine whose cores the model saturates (torch starts
one compute thread per core): the server thread would wait for a core behind them. So user
code runs at a lower CPU priority (niceness :data:`USER_CODE_NICENESS`, per thread, inherited
by the threads it starts, torch's among them): the control path always gets a core first,
and user code still has every idle cycle.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any, AsyncIterator, Callable, Coroutine, TypeVar

import uvloop

log = logging.getLogger("modelplex.replica")

T = TypeVar("T")

#: How much lower than the server loop's the CPU priority of user code is (Linux niceness).
USER_CODE_NICENESS = 10


class UserCodeLoop:
    """An event loop in its own thread, at user code's priority; :meth:`submit` runs a coroutine
    there from another thread (the server loop starting and stopping what runs on it)."""

    def __init__(self, name: str = "modelplex-user-code"):
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        self._thread: threading.Thread | None = None
        self._name = name

    def start(self) -> None:
        """Start the loop; called from the server's thread, which keeps its priority."""
        server = threading.get_native_id()
        # Threads that exist already were started by the handler's construction (torch's
        # compute pool, for one): they are user code too.
        for thread_id in _thread_ids():
            if thread_id != server:
                _lower_priority(thread_id)
        self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
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

    async def submit(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The result of ``coroutine``, run on the user loop (awaited from another loop), in the
        caller's context: started inside the replica's runtime (``modelplex.runtime``), what it
        starts there (the API port's server, every request's task) carries that runtime."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    async def stop(self, timeout: float = 10.0) -> None:
        """Cancel what still runs there, then end the thread."""
        if self._thread is None or not self._thread.is_alive():
            return
        try:
            await asyncio.wait_for(self.submit(_cancel_all()), timeout)
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


class TakingTurns:
    """A handler's stream, read where it runs: before each item after the first, the loop goes
    round once, so generators that compute (and never await) take turns chunk by chunk with
    each other and with new requests."""

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
