"""The document fetcher: brings a stale replica's entry up to the version its summary announced.

Pod annotations and response headers carry only a fixed-size summary of a replica's loaded
models (:class:`modelplex.wire.loaded.LoadedSummary`). When one announces a version newer than the
document the table holds, this fetches ``GET /v1/models`` from that replica (one fetch in
flight per replica; a failed one is retried after a second) and applies it as observed when
the fetch started.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp

from modelplex.wire.loaded import LoadedModels
from modelplex_router.table import Replica, ReplicaInfo, RoutingTable

log = logging.getLogger("modelplex.router.discovery")

RETRY_S = 1.0


class DocumentFetcher:
    """Runs beside any discovery source until cancelled."""

    def __init__(self, *, timeout_s: float = 5.0):
        self.timeout_s = timeout_s

    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        wake = asyncio.Event()
        table.stale_listener = wake.set
        wake.set()  # what is stale already
        fetching: dict[str, asyncio.Task[None]] = {}

        def done(name: str) -> None:
            fetching.pop(name, None)
            wake.set()  # the replica may have changed again meanwhile
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()) as session:
            try:
                while True:
                    await wake.wait()
                    wake.clear()
                    for replica in table.stale_replicas():
                        if replica.name not in fetching:
                            task = asyncio.create_task(self._fetch(session, table, clock, replica))
                            fetching[replica.name] = task
                            task.add_done_callback(lambda _, name=replica.name: done(name))  # type: ignore[misc]  # mypy: lambda with a default
            finally:
                table.stale_listener = None
                for task in fetching.values():
                    task.cancel()
                await asyncio.gather(*fetching.values(), return_exceptions=True)

    async def _fetch(self, session: aiohttp.ClientSession, table: RoutingTable, clock: Callable[[], float],
                     replica: Replica) -> None:
        started = clock()
        try:
            async with session.get(replica.url + "/v1/models") as response:
                if response.status != 200:
                    raise ValueError(f"answered {response.status}")
                document = LoadedModels.parse(await response.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
            log.debug("fetching the loaded models of %s failed: %s", replica.name, error)
            await asyncio.sleep(RETRY_S)  # holds its slot: the retry comes after the pause
            return
        current = table.get(replica.name)
        if current is not None:
            table.apply(ReplicaInfo(current.name, current.url, current.ready, document.models, document.capacity,
                                    document.version, document.loading), started)
