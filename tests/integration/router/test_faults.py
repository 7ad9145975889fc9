"""Faults at the HTTP edges: a stream cut by a replica's death, and SIGTERM drains."""

from __future__ import annotations

import asyncio
import json
import signal

import aiohttp
import pytest

from modelplex.wire.names import MODEL_ID_HEADER

TIMEOUT = aiohttp.ClientTimeout(total=60)


async def test_a_replica_dying_mid_stream_ends_an_sse_stream_with_an_error_event(plex):
    cluster = await plex.start(replicas=1, handler="handlers:Streamer")
    headers = {MODEL_ID_HEADER: "s1", "Accept": "text/event-stream"}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(cluster.router_url + "/", json={"die": True, "chunks": 3}, headers=headers) as resp:
            assert resp.status == 200
            received = b""
            with pytest.raises(aiohttp.ClientPayloadError):  # still a cut, never a clean end
                async for chunk in resp.content.iter_any():
                    received += chunk
    events = [block for block in received.decode().split("\n\n") if block.strip()]
    assert json.loads(events[0].removeprefix("data: "))["chunk"] == 0
    last = events[-1].splitlines()
    assert last[0] == "event: error"
    error = json.loads(last[1].removeprefix("data: "))["error"]
    assert error["code"] == "replica_failed" and "r0" in error["message"]


async def test_sigterm_drains_a_replica_and_a_router_without_losing_the_request_in_flight(plex, tmp_path):
    cluster = await plex.start(replicas=1)
    gate = tmp_path / "gate"
    replica, router = cluster.replica_procs["r0"], cluster.router_proc
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        held = asyncio.create_task(session.post(cluster.router_url + "/", json={"gate": str(gate)},
                                                headers={MODEL_ID_HEADER: "m"}))
        try:
            async def busy():
                return (await plex.table(session, cluster.router_url))["r0"]["inflight"] == 1
            await plex.wait_until(busy, timeout=30, what="the request to reach the replica")

            replica.popen.send_signal(signal.SIGTERM)
            replica_url = cluster.replica_urls["r0"]

            async def draining():
                async with session.get(replica_url + "/readyz") as resp:
                    return resp.status == 503 and (await resp.json())["error"]["message"] == "shutting down"
            await plex.wait_until(draining, timeout=10, what="the replica to turn not ready")
            # No new work: a router would send this elsewhere.
            async with session.post(replica_url + "/v1/invoke", json={}, headers={MODEL_ID_HEADER: "m"}) as resp:
                assert resp.status == 503 and (await resp.json())["error"]["code"] == "not_ready"

            router.popen.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            assert replica.alive() and router.alive()  # both still finishing the request in flight
        finally:
            gate.touch()
        answer = await asyncio.wait_for(held, 30)
        assert answer.status == 200
        assert (await answer.json())["model"] == "m"
    assert await asyncio.to_thread(replica.popen.wait, 30) == 0
    assert await asyncio.to_thread(router.popen.wait, 30) == 0
