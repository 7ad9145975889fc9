"""Busy replicas stay in rotation: user code computing for its clients does not make a replica
look dead, and a replica that really stops answering leaves rotation and comes back.

Real processes on loopback (a router over static replicas, as local mode runs them); every
load loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import time
from urllib.parse import urlsplit

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER
from modelplex_operator.builders import REPLICA_READINESS_TIMEOUT_S

CLIENTS = 16
LOAD_S = 20.0
MAX_REQUESTS_PER_CLIENT = 2_000
PROBE_EVERY_S = 0.05
TIMEOUT = aiohttp.ClientTimeout(total=120)


async def _closed_loop(session, url: str, body: dict, *, stream: bool, until: float) -> list[int]:
    statuses = []
    for _ in range(MAX_REQUESTS_PER_CLIENT):
        if time.monotonic() >= until:
            break
        async with session.post(url + "/", json=body) as response:
            if stream:
                async for _line in response.content:  # read every chunk as it comes
                    pass
            else:
                await response.read()
            statuses.append(response.status)
    return statuses


def _probe_readyz(replica_url: str, until: float) -> list[float]:
    """The replica's /readyz on its control port every 50 ms, as the kubelet asks it: a probe
    that takes longer than the pod's readiness timeout fails. From a thread with one kept-alive
    connection, so the test's own busy event loop is not in the measurement; how fast it
    answers is bench/replica's to measure."""
    parts = urlsplit(replica_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=REPLICA_READINESS_TIMEOUT_S)
    latencies = []
    try:
        while time.monotonic() < until:
            started = time.perf_counter()
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200, body
            latencies.append(time.perf_counter() - started)
            time.sleep(PROBE_EVERY_S)
    finally:
        connection.close()
    return latencies


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def _hold_load(plex, handler: str, body: dict, *, stream: bool) -> None:
    cluster = await plex.start(replicas=1, handler=handler, max_ongoing=32)
    replica_url = next(iter(cluster.control_urls.values()))
    until = time.monotonic() + LOAD_S
    async with aiohttp.ClientSession(timeout=TIMEOUT) as clients:
        probe = asyncio.create_task(asyncio.to_thread(_probe_readyz, replica_url, until))
        results = await asyncio.gather(*(
            _closed_loop(clients, cluster.router_url, body, stream=stream, until=until) for _ in range(CLIENTS)))
        latencies = await probe
    statuses = [status for result in results for status in result]
    assert len(statuses) >= CLIENTS, statuses  # every client got answers
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    router_log = cluster.router_proc.log.read_text()
    since_ready = router_log[router_log.index(" is ready"):]  # before that, the replica was starting
    assert "is not ready" not in since_ready, since_ready[-2000:]
    assert len(latencies) > 50
    print(f"/readyz p99 {_p99(latencies) * 1000:.1f} ms over {len(latencies)} probes")


async def test_a_cpu_bound_async_handler_under_load_keeps_its_replica_ready_and_answers_every_request(plex):
    await _hold_load(plex, "handlers:Forward", {}, stream=False)


async def test_a_cpu_bound_streaming_handler_under_load_keeps_its_replica_ready_and_answers_every_stream(plex):
    await _hold_load(plex, "handlers:ForwardStream", {"chunks": 20}, stream=True)


async def test_a_frozen_replica_leaves_rotation_and_comes_back_without_losing_a_request(plex):
    cluster = await plex.start(replicas=2)
    frozen = cluster.replica_procs["r0"].popen.pid
    statuses: list[int] = []
    stop = asyncio.Event()

    async def client(session, index):
        for n in range(MAX_REQUESTS_PER_CLIENT):
            if stop.is_set():
                return
            async with session.post(cluster.router_url + "/", json={"n": n},
                                    headers={MODEL_ID_HEADER: f"m{index}"}) as response:
                await response.read()
                statuses.append(response.status)
            await asyncio.sleep(0.01)

    async def state(session) -> dict[str, bool]:
        table = await plex.table(session, cluster.router_url)
        return {name: entry["ready"] for name, entry in table.items()}

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        clients = [asyncio.create_task(client(session, i)) for i in range(4)]
        try:
            await plex.wait_until(lambda: _enough(statuses, 20), timeout=60, what="traffic on both replicas")
            os.kill(frozen, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                await plex.wait_until(lambda: _out(state(session)), timeout=30, what="r0 out of rotation")
                left_after = time.monotonic() - stopped_at
                answered_while_frozen = len(statuses)
                await plex.wait_until(lambda: _enough(statuses, answered_while_frozen + 20), timeout=60,
                                      what="r1 serving while r0 is frozen")
            finally:
                os.kill(frozen, signal.SIGCONT)
            await plex.wait_until(lambda: _back(state(session)), timeout=30, what="r0 back in rotation")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*clients), 60)

    # Three failed polls of 2 s each take it out: not one slow poll, and not never.
    assert 4.0 <= left_after <= 12.0, left_after
    assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    assert "replica r0" in cluster.router_proc.log.read_text()


async def _enough(statuses: list[int], count: int) -> bool:
    return len(statuses) >= count


async def _out(state) -> bool:
    current = await state
    return current.get("r0") is False and current.get("r1") is True


async def _back(state) -> bool:
    current = await state
    return current.get("r0") is True
