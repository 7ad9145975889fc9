"""The document fetcher: brings a stale replica's entry up to the version its summary announced.

Pod annotations and response headers carry only a fixed-size summary of a replica's loaded
models (:class:`modelplex.wire.loaded.LoadedSummary`). When one announces a version newer than
the document the table holds, this reads ``GET /v1/models`` from that replica
(:func:`modelplex.loaded_client.fetch_loaded_models`, one reader in flight per replica) and
hands the table a :class:`~modelplex_router.events.DocumentFetched`, observed when the read
started. The reader keeps at it while the replica stays stale: at once when a newer version
was announced meanwhile, else after :data:`RETRY_S` (a failed read, or a document still older
than the announced version).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp

from modelplex.http import internal_session
from modelplex.loaded_client import FETCH_TIMEOUT_S, DocumentUnavailable, fetch_loaded_models
from modelplex_router.events import DocumentFetched
from modelplex_router.table import RoutingTable

log = logging.getLogger("modelplex.router.discovery")

RETRY_S = 1.0


class DocumentFetcher:
    """Runs beside any discovery source until cancelled."""

    def __init__(self, *, timeout_s: float = FETCH_TIMEOUT_S):
        self.timeout_s = timeout_s

    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        readers: dict[str, asyncio.Task[None]] = {}
        async with internal_session(cookie_jar=aiohttp.DummyCookieJar()) as session:
            try:
                while True:
                    for replica in table.stale_replicas():
                        if replica.name not in readers:
                            readers[replica.name] = asyncio.create_task(
                                self._keep_current(session, table, clock, replica.name, readers))
                    await table.wait_stale()
            finally:
                for task in readers.values():
                    task.cancel()
                await asyncio.gather(*readers.values(), return_exceptions=True)

    async def _keep_current(self, session: aiohttp.ClientSession, table: RoutingTable, clock: Callable[[], float],
                            name: str, readers: dict[str, asyncio.Task[None]]) -> None:
        """Read ``name``'s document until the table's is as new as its last summary."""
        try:
            while (replica := table.get(name)) is not None and replica.stale and replica.url:
                announced, started = replica.latest_version, clock()
                try:
                    document = await fetch_loaded_models(session, replica.url, timeout_s=self.timeout_s)
                except DocumentUnavailable as error:
                    log.debug("fetching the loaded models of %s failed: %s", name, error)
                    await asyncio.sleep(RETRY_S)
                    continue
                table.apply(DocumentFetched(name, document), started)
                current = table.get(name)
                if current is not None and current.stale and current.latest_version <= announced:
                    await asyncio.sleep(RETRY_S)  # older than announced: the replica may not have caught up
        finally:
            readers.pop(name, None)
