"""No client locks others out (#37): one client's idle sockets are bounded and closed in time,
the control port answers probes and scrapes throughout, and a stream whose client stopped
reading frees its replica slot. Real router and replica processes on loopback, raw sockets and
aiohttp as the clients."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

TIMEOUT = aiohttp.ClientTimeout(total=60)
#: Small bounds, so the test holds every connection the router allows and sees them time out.
MAX_CONNECTIONS = 24
HEADER_TIMEOUT_S = 3.0
STREAM_IDLE_TIMEOUT_S = 2.0


async def _healthz(session: aiohttp.ClientSession, base: str) -> int:
    async with session.get(base + "/healthz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
        return resp.status


async def _answer_to_a_new_connection(port: int) -> bytes:
    """What the router says to one more connection (the first bytes, or b"" when it closes it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()


async def test_one_client_holding_every_connection_locks_nobody_out_for_longer_than_the_header_timeout(plex):
    cluster = await plex.start(replicas=1, spec={"router": {"maxConnections": MAX_CONNECTIONS,
                                                            "headerTimeoutSeconds": HEADER_TIMEOUT_S}})
    port = int(cluster.router_url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession(timeout=TIMEOUT) as control:
        # One client opens every connection the router allows: silent ones, and ones that stop
        # half way through a request line.
        opened = time.monotonic()
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
        for _, writer in held[::2]:
            writer.write(b"GET /healthz HT")
        # While they are held the control port still answers the kubelet's probe at once (a round
        # trip through the router's loop, which has taken every held connection by then), and
        # one more connection is refused: a 503, then closed.
        assert await _healthz(control, cluster.router_control_url) == 200
        refused = await _answer_to_a_new_connection(port)
        assert refused.startswith(b"HTTP/1.1 503") and b"Connection: close" in refused, refused
        assert await _healthz(control, cluster.router_control_url) == 200
        assert time.monotonic() - opened < HEADER_TIMEOUT_S, "the test was too slow to see the sockets held"

        # The router closes each of them unanswered within the header timeout (+ 2 s).
        async def closed(reader: asyncio.StreamReader) -> bytes:
            return await asyncio.wait_for(reader.read(4096), HEADER_TIMEOUT_S + 2)

        answers = await asyncio.gather(*(closed(reader) for reader, _ in held))
        took = time.monotonic() - opened
        assert answers == [b""] * MAX_CONNECTIONS  # closed, never answered
        assert took <= HEADER_TIMEOUT_S + 2, took
        for _, writer in held:
            writer.close()

        # Another client is served right after, and the control port answered throughout.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as other:
            async with other.post(cluster.router_url + "/", json={"hello": 1}, headers={MODEL_ID_HEADER: "m1"}) as resp:
                assert resp.status == 200, await resp.text()
        assert await _healthz(control, cluster.router_control_url) == 200
        async with control.get(cluster.router_control_url + "/metrics") as resp:
            assert resp.status == 200 and "modelplex_router_requests_total" in await resp.text()


async def test_the_router_s_metrics_are_on_its_control_port_and_not_on_the_public_one(plex):
    cluster = await plex.start(replicas=1)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for path in ("/healthz", "/readyz"):
            for base in (cluster.router_url, cluster.router_control_url):
                async with session.get(base + path) as resp:
                    assert resp.status == 200, (base, path)
        async with session.get(cluster.router_control_url + "/metrics") as resp:
            assert "modelplex_router_requests_total" in await resp.text()
        # On the public port /metrics is a path like any other: the handler's (Echo answers it).
        async with session.get(cluster.router_url + "/metrics") as resp:
            assert "modelplex_router_" not in await resp.text()
        # The control port answers its three paths and nothing else.
        async with session.post(cluster.router_control_url + "/", json={}) as resp:
            assert resp.status in (404, 405)


async def test_a_client_that_stops_reading_a_large_stream_frees_its_slot_within_the_stream_idle_timeout(plex):
    cluster = await plex.start(replicas=1, handler="handlers:Streamer", max_ongoing=1,
                               spec={"router": {"streamIdleTimeoutSeconds": STREAM_IDLE_TIMEOUT_S}})
    port = int(cluster.router_url.rsplit(":", 1)[1])
    # A raw client with a small receive buffer: it reads the head, then stops reading.
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", port))
    body = b'{"chunks": 1000000, "pad": 65536}'
    stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"{MODEL_ID_HEADER}: big\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    try:
        assert stalled.recv(1024).startswith(b"HTTP/1.1 200")  # the stream began; now it is not read
        stopped = time.monotonic()
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            # The one slot is the stalled stream's until the router cuts it; then this is served.
            async with session.post(cluster.router_url + "/", json={"chunks": 2},
                                    headers={MODEL_ID_HEADER: "big"}) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            served_after = time.monotonic() - stopped
            assert served_after <= STREAM_IDLE_TIMEOUT_S + 8, served_after

            async def counted() -> bool:
                text = await (await session.get(cluster.router_control_url + "/metrics")).text()
                return any(line.startswith("modelplex_router_requests_total{") and 'code="499"' in line
                           and not line.endswith(" 0.0") for line in text.splitlines())

            await plex.wait_until(counted, timeout=10, what="the cut stream counted as 499")
    finally:
        stalled.close()
