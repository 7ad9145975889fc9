"""Streaming through the router: chunks pass as they are made, many streams at once."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from modelplex.wire.names import MODEL_ID_HEADER

TIMEOUT = aiohttp.ClientTimeout(total=60)


async def test_the_first_chunk_arrives_before_the_handler_finishes(plex, tmp_path):
    cluster = await plex.start(replicas=1, handler="handlers:Streamer")
    gate = tmp_path / "gate"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        body = {"gate": str(gate), "chunks": 3}
        async with session.post(cluster.router_url + "/", json=body, headers={MODEL_ID_HEADER: "s1"}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/x-ndjson")
            first = json.loads(await asyncio.wait_for(resp.content.readline(), 30))
            # The handler is blocked on the gate, which only this test can open.
            assert first["chunk"] == 0 and first["model"] == "s1"
            assert not gate.exists()
            gate.touch()
            rest = [json.loads(line) for line in (await resp.read()).splitlines()]
        assert rest == [{"gate_opened": True}, {"chunk": 1}, {"chunk": 2}]


async def test_server_sent_events_pass_through(plex):
    cluster = await plex.start(replicas=1, handler="handlers:Streamer")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        headers = {MODEL_ID_HEADER: "s1", "Accept": "text/event-stream"}
        async with session.post(cluster.router_url + "/v1/models/s1/predict", json={"chunks": 2},
                                headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            text = await resp.text()
    events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
    assert [e["chunk"] for e in events] == [0, 1]


async def test_two_hundred_concurrent_streams(plex, tmp_path):
    cluster = await plex.start(replicas=2, handler="handlers:Streamer", max_ongoing=128, capacity=2)
    gate = tmp_path / "gate"
    n = 200
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120), connector=connector) as session:
        first_seen = asyncio.Event()
        opened = 0

        async def stream(i):
            nonlocal opened
            body = {"gate": str(gate), "chunks": 3}
            async with session.post(cluster.router_url + "/", json=body,
                                    headers={MODEL_ID_HEADER: f"s{i % 2}"}) as resp:
                assert resp.status == 200
                first = json.loads(await resp.content.readline())
                assert first["chunk"] == 0
                opened += 1
                if opened == n:
                    first_seen.set()
                return [json.loads(line) for line in (await resp.read()).splitlines()]

        tasks = [asyncio.create_task(stream(i)) for i in range(n)]
        try:
            # Every stream has its first chunk while every handler still waits on the gate.
            await asyncio.wait_for(first_seen.wait(), 90)
            assert not gate.exists()
        finally:
            gate.touch()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 90)
    assert all(r == [{"gate_opened": True}, {"chunk": 1}, {"chunk": 2}] for r in results)


async def test_a_replica_dying_mid_stream_cuts_the_clients_stream(plex):
    # After the first chunk nothing can be retried; the client must see a broken stream,
    # never one that looks finished. The other replica keeps serving.
    cluster = await plex.start(replicas=2, handler="handlers:Streamer")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(cluster.router_url + "/", json={"die": True, "chunks": 3},
                                headers={MODEL_ID_HEADER: "s1"}) as resp:
            assert resp.status == 200
            first = json.loads(await resp.content.readline())
            assert first["chunk"] == 0
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        async with session.post(cluster.router_url + "/", json={"chunks": 2},
                                headers={MODEL_ID_HEADER: "s1"}) as resp:
            assert resp.status == 200
            assert [json.loads(line)["chunk"] for line in (await resp.read()).splitlines()] == [0, 1]


async def test_a_client_hanging_up_frees_its_slot_in_the_router(plex, tmp_path):
    cluster = await plex.start(replicas=1, handler="handlers:Streamer")
    gate = tmp_path / "never"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        resp = await session.post(cluster.router_url + "/", json={"gate": str(gate)}, headers={MODEL_ID_HEADER: "s1"})
        assert json.loads(await resp.content.readline())["chunk"] == 0
        resp.close()  # hang up while the handler still waits

        async def freed():
            return (await plex.table(session, cluster.router_url))["r0"]["inflight"] == 0
        await plex.wait_until(freed, timeout=30, what="the router to free the slot")
        assert await plex.metric(session, cluster.router_control_url, "modelplex_router_inflight_requests") == 0
        async with session.get(cluster.router_control_url + "/metrics") as r:
            assert 'code="499"' in await r.text()
