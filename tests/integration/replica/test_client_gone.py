"""A client that leaves a stream part way is counted as 499 by the replica, not as its own 500."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import wait_ready, wait_until

TIMEOUT = aiohttp.ClientTimeout(total=60)


def requests_by_code(text: str) -> dict[str, float]:
    codes = {}
    for line in text.splitlines():
        if line.startswith("modelplex_replica_requests_total{"):
            code = line.split('code="', 1)[1].split('"', 1)[0]
            codes[code] = codes.get(code, 0.0) + float(line.rsplit(" ", 1)[1])
    return codes


async def test_a_stream_the_client_closed_is_a_499_in_the_replicas_metrics(processes, manifest):
    replica = processes.replica(manifest(handler="probe:Ticker"))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        for accept in ("application/x-ndjson", "text/event-stream"):
            async with aiohttp.ClientSession(timeout=TIMEOUT) as leaving:  # its own connection, closed below
                async with leaving.post(replica.url + "/v1/invoke", json={},
                                        headers={MODEL_ID_HEADER: "t1", "Accept": accept}) as response:
                    assert response.status == 200
                    first = await asyncio.wait_for(response.content.readline(), 30)
                    assert b"tick" in first
                # leaving the block closes the connection mid-stream (a browser tab closed)

        async def counted() -> dict[str, float] | None:
            async with session.get(replica.url + "/metrics") as response:
                codes = requests_by_code(await response.text())
            return codes if codes.get("499") == 2 else None

        codes = await wait_until(counted, timeout=30, what="both abandoned streams counted as 499")
        assert "500" not in codes, codes
        async with session.post(replica.url + "/v1/invoke", json={}, headers={MODEL_ID_HEADER: "t1"}) as response:
            assert response.status == 200  # the replica serves on
            assert json.loads(await response.content.readline()) == {"tick": 0}
