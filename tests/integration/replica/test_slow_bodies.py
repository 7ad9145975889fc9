"""Clients that trickle their bodies hold no slot: the replica reads a body before the request
takes a slot, within spec.router.bodyTimeoutSeconds, and answers 408 when it does not arrive."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import wait_ready

BODY_TIMEOUT_S = 3.0
TIMEOUT = aiohttp.ClientTimeout(total=60)


async def trickle(url: str, stop: asyncio.Event) -> tuple[int, dict, float]:
    """POST a 1,000-byte body one byte every 0.2 s (bounded by ``stop`` and 300 bytes); return
    the status, the JSON error and when the answer came (loop time from the first byte)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    loop = asyncio.get_running_loop()
    started = loop.time()
    writer.write((f"POST /v1/invoke HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  f"{MODEL_ID_HEADER}: slow\r\nContent-Length: 1000\r\n\r\n").encode())
    answer = asyncio.ensure_future(_response(reader))
    try:
        for _ in range(300):
            if answer.done() or stop.is_set():
                break
            try:
                writer.write(b" ")
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.2)
        status, body, answered = await asyncio.wait_for(answer, 30)
    finally:
        writer.close()
    elapsed = answered - started
    return status, json.loads(body), elapsed


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, float]:
    """(status, body, loop time it was complete) of one HTTP/1.1 answer with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    body = await reader.readexactly(length)
    return status, body, asyncio.get_running_loop().time()


async def test_two_trickling_clients_hold_no_slot_and_get_408_within_the_body_timeout(processes, manifest):
    replica = processes.replica(manifest(maxOngoingRequests=2, batching={"batchWaitTimeoutMs": 1},
                                         router={"bodyTimeoutSeconds": BODY_TIMEOUT_S}))
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        slow = [asyncio.create_task(trickle(replica.url, stop)) for _ in range(2)]
        await asyncio.sleep(0.5)  # both are sending their bodies now
        statuses = []
        for i in range(10):  # meanwhile, every other request is served
            async with session.post(replica.url + "/v1/invoke", json={"n": i},
                                    headers={MODEL_ID_HEADER: "fast"}) as response:
                statuses.append(response.status)
                assert (await response.json())["echo"] == {"n": i}
        assert all(not task.done() for task in slow), "the slow clients were answered before their timeout"
        try:
            results = await asyncio.wait_for(asyncio.gather(*slow), BODY_TIMEOUT_S + 30)
        finally:
            stop.set()
        async with session.get(replica.url + "/metrics") as response:
            metrics = await response.text()
    assert statuses == [200] * 10
    for status, body, elapsed in results:
        assert status == 408
        assert body["error"]["code"] == "request_timeout" and "bodyTimeoutSeconds" in body["error"]["message"]
        assert elapsed < BODY_TIMEOUT_S + 2.0  # functional bound: the timeout, plus slack
    assert 'modelplex_replica_requests_total{code="408",deployment="probe"} 2.0' in metrics
