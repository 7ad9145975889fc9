"""The router's placer of declared copies: what it leases on which replica, and when it renews.
The replicas' pin endpoint is a real HTTP server on loopback; the clock is a fake one."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from modelplex.wire.loaded import LoadedModels
from modelplex.wire.pins import PINS_PATH, place_pins
from modelplex_router.events import ReplicaGone, ReplicaSeen
from modelplex_router.pins import Pinner
from modelplex_router.record import Held
from modelplex_router.table import RoutingTable

pytestmark = pytest.mark.looptime


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def pin_endpoint(status: int = 200):
    """``POST /v1/pins`` on loopback; yields (its URL, the (path prefix, body) it was sent)."""
    asked: list[tuple[str, dict]] = []

    async def pin(request: web.Request) -> web.Response:
        asked.append((request.match_info["replica"], await request.json()))
        return web.json_response({"pinned": {}}, status=status)

    app = web.Application()
    app.router.add_post("/{replica}" + PINS_PATH, pin)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        await runner.cleanup()


def seen(table: RoutingTable, base: str, name: str, capacity: int = 4, ready: bool = True) -> None:
    table.apply(ReplicaSeen(name, f"{base}/{name}", ready, Held.of(LoadedModels(version=1, capacity=capacity))), 0.0)


async def test_each_replica_is_leased_its_share_of_the_placement():
    table = RoutingTable()
    async with pin_endpoint() as (base, asked), aiohttp.ClientSession() as session:
        for name in ("r0", "r1", "r2"):
            seen(table, base, name)
        seen(table, base, "r3", ready=False)  # not ready: no pins
        pinner = Pinner({"a": 2, "b": 1}, table, lambda: session, Clock(), lease_s=30)
        assert await pinner.renew(pinner.ready())
    expected = place_pins({"a": 2, "b": 1}, {"r0": 4, "r1": 4, "r2": 4})
    assert {name: tuple(body["models"]) for name, body in asked} == {
        name: models for name, models in expected.replicas.items() if models}
    assert all(body["ttlSeconds"] == 30 and body["wait"] is False for _, body in asked)


async def test_a_replica_that_refuses_its_pins_is_tried_again_at_the_next_check():
    table = RoutingTable()
    async with pin_endpoint(status=503) as (base, asked), aiohttp.ClientSession() as session:
        seen(table, base, "r0")
        pinner = Pinner({"a": 1}, table, lambda: session, Clock(), check_every_s=1.0)
        task = asyncio.create_task(pinner.run())
        await asyncio.sleep(2.5)  # virtual time: three checks, each a retry
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [name for name, _ in asked] == ["r0", "r0", "r0"]


async def test_it_renews_on_schedule_and_at_once_when_a_replica_comes_or_goes():
    table, clock = RoutingTable(), Clock()
    async with pin_endpoint() as (base, asked), aiohttp.ClientSession() as session:
        seen(table, base, "r0")
        pinner = Pinner({"a": 2}, table, lambda: session, clock, renew_every_s=10, check_every_s=1.0)
        task = asyncio.create_task(pinner.run())
        await asyncio.sleep(0.5)
        assert [name for name, _ in asked] == ["r0"] and pinner.placement.missing == {"a": 1}
        await asyncio.sleep(3)  # nothing changed and the renewal is not due: no pin
        assert len(asked) == 1
        seen(table, base, "r1")  # a new replica: placed at the next check
        await asyncio.sleep(1)
        assert sorted(name for name, _ in asked[1:]) == ["r0", "r1"] and pinner.placement.missing == {}
        clock.now += 10  # the renewal is due
        await asyncio.sleep(1)
        assert sorted(name for name, _ in asked[3:]) == ["r0", "r1"]
        table.apply(ReplicaGone("r1"), 0.0)
        await asyncio.sleep(1)
        assert [name for name, _ in asked[5:]] == ["r0"] and pinner.placement.missing == {"a": 1}
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
