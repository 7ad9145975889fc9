"""Two ways to run decode → detect → encode over a whole video, as deployments of their own.

:class:`NaiveOrchestrator` runs stage after stage: decode the whole video, detect on all of
it, encode all of it, then answer. Nothing comes out before the last stage is done, and
every stage holds the whole video at once.

:class:`StreamingOrchestrator` runs chunk by chunk: as each decoded chunk arrives it goes
to detect and then encode, while the decoder is still working on the next ones, and encoded
chunks stream out in order. A window bounds the chunks in flight; when it is full the
orchestrator stops reading the decoder's stream, which (through TCP) stops the decoder, so a
slow client slows the whole pipeline instead of filling memory.

Both pass their own request's model id on to detect, the multiplexed stage:
``handle("detect").options(multiplexed_model_id=get_multiplexed_model_id())``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, AsyncIterator, Awaitable, Callable

from modelplex import get_multiplexed_model_id, handle
from modelplex.wire.errors import PayloadTooLarge

#: Chunks between "read from the decoder" and "sent to the client", at most (the backpressure).
WINDOW = int(os.environ.get("PIPELINE_WINDOW", "4"))
#: The most decoded video the naive orchestrator holds: what one call to detect may carry
#: (its maxRequestBytes), less room for the JSON around the frames.
NAIVE_MAX_BYTES = int(os.environ.get("PIPELINE_NAIVE_MAX_BYTES", str(60 * 1024 * 1024)))


class NaiveOrchestrator:
    """Stage after stage, each over the whole video; one answer at the end."""

    def __init__(self):
        self.decode = handle("decode").options(stream=True)
        self.detect = handle("detect")
        self.encode = handle("encode")

    async def __call__(self, video):
        decoded, size = [], 0
        async with self.decode.remote(video) as stream:
            async for chunk in stream:  # the whole video, decoded, before anything else
                size += len(chunk["frames"]["data"])
                if size > NAIVE_MAX_BYTES:
                    # Holding it all is the naive way's cost: refuse rather than grow without bound.
                    raise PayloadTooLarge(f"the decoded video passes {NAIVE_MAX_BYTES} bytes; "
                                          "the streaming orchestrator takes videos of any length")
                decoded.append(chunk)
        detect = self.detect.options(multiplexed_model_id=get_multiplexed_model_id())
        detected = await detect.remote({"chunks": decoded})  # every frame, in one call
        encoded = await self.encode.remote({"chunks": detected["chunks"]})
        return {"chunks": encoded["chunks"]}


class StreamingOrchestrator:
    """Chunk by chunk across the stages; encoded chunks stream out in order as they are ready."""

    def __init__(self):
        self.decode = handle("decode").options(stream=True)
        self.detect = handle("detect")
        self.encode = handle("encode")
        self.window = WINDOW

    async def __call__(self, video):
        detect = self.detect.options(multiplexed_model_id=get_multiplexed_model_id())

        async def detect_and_encode(chunk: dict) -> dict:
            detected = await detect.remote({"chunks": [chunk]})
            encoded = await self.encode.remote({"chunks": detected["chunks"]})
            return encoded["chunks"][0]

        async for record in pipelined(self.decode.remote(video), detect_and_encode, window=self.window):
            yield record


_END = object()


async def pipelined(source: Any, work: Callable[[Any], Awaitable[Any]], *, window: int) -> AsyncIterator[Any]:
    """``work(item)`` for each item of ``source``, up to ``window`` at once, results in order.

    ``source`` is an async iterator, closed (``aclose``) when this stops for any reason. An
    item is read from it only when a slot in the window is free, and a slot frees only when
    its result is handed on: a consumer that stops asking stops the reading, so nothing
    upstream runs more than ``window`` items ahead of it (plus what sockets hold). The first
    failure (of the source or of a ``work``) is raised here, after the results before it;
    everything still running is then cancelled.
    """
    if window < 1:
        raise ValueError("window must be >= 1")
    slots = asyncio.Semaphore(window)
    # Holds at most `window` tasks (each took a slot) and then one end marker or error.
    started: asyncio.Queue = asyncio.Queue()

    async def feed() -> None:
        try:
            iterator = source.__aiter__()
            while True:
                await slots.acquire()
                try:
                    item = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                started.put_nowait(asyncio.create_task(work(item)))
            started.put_nowait(_END)
        except Exception as error:  # noqa: BLE001 - handed to the consumer, in order
            started.put_nowait(error)
        finally:
            await _close(source)

    feeder = asyncio.create_task(feed())
    current: asyncio.Task | None = None
    try:
        while True:
            entry = await started.get()
            if entry is _END:
                break
            if isinstance(entry, Exception):
                raise entry
            current = entry
            result = await current
            slots.release()
            yield result
    finally:
        # Cancelled, failed or closed early: stop reading and stop every chunk in flight.
        leftovers = [feeder] + ([current] if current is not None and not current.done() else [])
        while not started.empty():
            entry = started.get_nowait()
            if isinstance(entry, asyncio.Task):
                leftovers.append(entry)
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)


async def _close(source: Any) -> None:
    close = getattr(source, "aclose", None)
    if close is not None:
        await close()
