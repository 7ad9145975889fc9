"""Static discovery: a fixed list of replica URLs, each polled every ~150 ms.

Each poll reads ``GET /v1/models`` (models, capacity, version, loading) and ``GET /readyz``
at once. A poll that started at T shows everything the replica did before T, so the table
gets it with ``observed_at=T`` (lag 0).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable
from urllib.parse import urlsplit

import aiohttp

from modelplex_router.discovery.base import Discovery, parse_models_document, unreachable
from modelplex_router.table import ReplicaInfo, RoutingTable

log = logging.getLogger("modelplex.router.discovery")


def parse_replica_arg(value: str) -> tuple[str, str]:
    """``URL`` or ``NAME=URL`` (``http://`` may be left out) as (name, base URL).

    The name defaults to ``host:port``; it shows in ``/v1/replicas`` and feeds the stable hash,
    so routers given the same list place new models alike.
    """
    name, sep, url = value.partition("=")
    if not sep or "://" in name:
        name, url = "", value
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"replica {value!r}: expected http://HOST:PORT (optionally NAME=http://HOST:PORT)")
    return (name.strip() or parts.netloc), url


class StaticDiscovery(Discovery):
    """Polls each of ``replicas`` (``URL`` or ``NAME=URL``) every ``interval_s``."""

    lag_s = 0.0

    def __init__(self, replicas: list[str], *, interval_s: float = 0.15, timeout_s: float = 1.0):
        self.replicas = [parse_replica_arg(r) for r in replicas]
        names = [name for name, _ in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replica names must be distinct (got {names})")
        self.interval_s = interval_s
        self.timeout_s = timeout_s

    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        # A session of its own: polls must not queue behind (or hold) proxy connections.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                         cookie_jar=aiohttp.DummyCookieJar()) as session:
            tasks = [
                asyncio.create_task(self._poll(session, table, clock, name, url), name=f"poll {name}")
                for name, url in self.replicas
            ]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _poll(self, session: aiohttp.ClientSession, table: RoutingTable,
                    clock: Callable[[], float], name: str, url: str) -> None:
        was_ready: bool | None = None
        while True:
            started = clock()
            info = await self._read(session, name, url)
            table.apply(info, started)
            if info.ready != was_ready:
                log.info("replica %s (%s) is %s", name, url, "ready" if info.ready else "not ready")
                was_ready = info.ready
            await asyncio.sleep(max(0.0, self.interval_s - (clock() - started)))

    async def _read(self, session: aiohttp.ClientSession, name: str, url: str) -> ReplicaInfo:
        try:
            models_doc, ready = await asyncio.gather(self._models(session, url), self._ready(session, url))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return unreachable(name, url)
        models, capacity, version, loading = parse_models_document(models_doc, source=url)
        return ReplicaInfo(name, url, ready, models, capacity, version, loading)

    @staticmethod
    async def _models(session: aiohttp.ClientSession, url: str) -> object:
        async with session.get(url + "/v1/models") as resp:
            if resp.status != 200:
                raise ValueError(f"GET /v1/models answered {resp.status}")
            return await resp.json(content_type=None)

    @staticmethod
    async def _ready(session: aiohttp.ClientSession, url: str) -> bool:
        async with session.get(url + "/readyz") as resp:
            await resp.read()
            return resp.status == 200
