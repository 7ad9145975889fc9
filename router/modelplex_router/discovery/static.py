"""Static discovery: a fixed list of replica URLs, each polled every ~150 ms.

Each poll reads ``GET /readyz``, then ``GET /v1/models`` (models, capacity, version, loading).
A poll that started at T shows everything the replica did before T, so the table
gets it with ``observed_at=T`` (lag 0). A failed poll alone does not take a replica out of
rotation (:mod:`modelplex_router.discovery.health`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable
from urllib.parse import urlsplit

import aiohttp

from modelplex.http import internal_session
from modelplex.loaded_client import DocumentUnavailable, fetch_loaded_models
from modelplex_router.discovery.base import Discovery, unreachable
from modelplex_router.discovery.health import FAILURE_THRESHOLD, Poll, PollHealth
from modelplex_router.events import ReplicaSeen
from modelplex_router.record import Held
from modelplex_router.table import RoutingTable

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

    def __init__(self, replicas: list[str], *, interval_s: float = 0.15, timeout_s: float = 2.0,
                 failure_threshold: int = FAILURE_THRESHOLD):
        self.replicas = [parse_replica_arg(r) for r in replicas]
        names = [name for name, _ in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replica names must be distinct (got {names})")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failure_threshold = failure_threshold

    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        # A session of its own: polls must not queue behind (or hold) proxy connections.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with internal_session(connector=connector, timeout=timeout,
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
        health = PollHealth(self.failure_threshold)
        was_ready: bool | None = None
        while True:
            started = clock()
            poll, seen = await self._read(session, name, url)
            ready = health.observe(poll, answered_traffic=table.answered_since(name, started))
            if seen is not None:
                table.apply(seen, started)
            elif not ready:
                table.apply(unreachable(name, url), started)
            if ready != was_ready:
                detail = "" if ready else f" ({poll.value}" + (
                    f", {health.failures} polls in a row)" if poll is Poll.FAILED else ")")
                log.info("replica %s (%s) is %s%s", name, url, "ready" if ready else "not ready", detail)
                was_ready = ready
            await asyncio.sleep(max(0.0, self.interval_s - (clock() - started)))

    async def _read(self, session: aiohttp.ClientSession, name: str, url: str) -> tuple[Poll, ReplicaSeen | None]:
        try:
            # Readiness first: a replica turns ready once its pre-loaded models are published, so a
            # model list read after a ready answer holds them (read side by side, a list answered
            # just before the preload ended could pair with a ready answered just after it).
            ready = await self._ready(session, url)
            document = await fetch_loaded_models(session, url, timeout_s=self.timeout_s)
        except aiohttp.ClientConnectorError:
            return Poll.REFUSED, None
        except DocumentUnavailable as error:
            return (Poll.REFUSED if error.refused else Poll.FAILED), None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return Poll.FAILED, None
        return (Poll.READY if ready else Poll.NOT_READY), ReplicaSeen(name, url, ready, Held.of(document))

    @staticmethod
    async def _ready(session: aiohttp.ClientSession, url: str) -> bool:
        async with session.get(url + "/readyz") as resp:
            await resp.read()
            return resp.status == 200
