"""The document fetcher reads a stale replica's /v1/models (a real server on loopback)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from modelplex.processes import wait_for_async
from modelplex.wire.loaded import LoadedSummary
from modelplex_router.discovery.documents import DocumentFetcher
from modelplex_router.events import ReplicaSeen, SummaryHeard
from modelplex_router.record import Held
from modelplex_router.table import RoutingTable


def announced(url: str, version: int) -> ReplicaSeen:
    """A pod event: the replica at ``url``, ready, its annotation at ``version``."""
    return ReplicaSeen("r1", url, True, Held(LoadedSummary(version=version, capacity=2)))


async def serve_documents(documents: list[dict]) -> tuple[web.AppRunner, str, list[int]]:
    """A replica stand-in whose /v1/models answers the next document of ``documents``."""
    served: list[int] = []

    async def models(request: web.Request) -> web.Response:
        served.append(len(served))
        return web.json_response(documents[min(len(served) - 1, len(documents) - 1)])

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", served


async def test_a_newer_summary_makes_the_table_fetch_the_document_once():
    runner, url, served = await serve_documents([{"version": 5, "capacity": 2, "models": ["a", "b"], "loading": []}])
    table = RoutingTable()
    loop = asyncio.get_running_loop()
    fetcher = asyncio.create_task(DocumentFetcher().run(table, loop.time))
    try:
        table.apply(announced(url, 5), loop.time())  # a summary: version 5
        await wait_for_async(lambda: table.get("r1").models == {"a", "b"}, 10, 0.01, "the document fetched")
        assert table.get("r1").version == 5 and not table.stale_replicas()
        table.apply(SummaryHeard(table.get("r1"), LoadedSummary(version=5).to_json()), loop.time())  # old news
        # The fetcher reads only what the table calls stale: old news leaves nothing to fetch.
        assert not table.stale_replicas()
        assert served == [0]
    finally:
        fetcher.cancel()
        await asyncio.gather(fetcher, return_exceptions=True)
        await runner.cleanup()


async def test_a_replica_that_changed_again_during_the_fetch_is_fetched_again():
    runner, url, served = await serve_documents([
        {"version": 1, "capacity": 2, "models": ["a"], "loading": []},
        {"version": 2, "capacity": 2, "models": ["a", "b"], "loading": []},
    ])
    table = RoutingTable()
    loop = asyncio.get_running_loop()
    table.apply(announced(url, 2), loop.time())
    fetcher = asyncio.create_task(DocumentFetcher().run(table, loop.time))
    try:
        await wait_for_async(lambda: table.get("r1").version == 2, 10, 0.01, "version 2 fetched")
        assert table.get("r1").models == {"a", "b"} and len(served) == 2
    finally:
        fetcher.cancel()
        await asyncio.gather(fetcher, return_exceptions=True)
        await runner.cleanup()
