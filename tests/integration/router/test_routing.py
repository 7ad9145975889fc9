"""The router in front of real replicas: placement, cache hits, view freshness, hot-model spread,
replica failures. Every process is real and on loopback; every load loop is bounded."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter, defaultdict

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

REPLICA_HEADER = "X-Modelplex-Replica"
TIMEOUT = aiohttp.ClientTimeout(total=60)


async def call(session, url, model, body=None, path="/"):
    headers = {MODEL_ID_HEADER: model} if model else {}
    async with session.post(url + path, json=body or {}, headers=headers) as resp:
        return resp.status, resp.headers.get(REPLICA_HEADER), await resp.json(content_type=None)


async def test_each_model_lands_on_one_replica_and_later_requests_hit_it(plex):
    cluster = await plex.start(replicas=2, capacity=2)
    models = ["model-a", "model-b", "model-c", "model-d"]
    served = defaultdict(set)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for model in models * 5:  # a fixed pattern, one request at a time
            status, replica, body = await call(session, cluster.router_url, model)
            assert status == 200, body
            assert body["model"] == model
            served[model].add(replica)

        assert all(len(replicas) == 1 for replicas in served.values()), served
        # The fewest-models rule puts two models on each replica: no evictions, no reloads.
        assert sorted(Counter(next(iter(r)) for r in served.values()).values()) == [2, 2]
        assert await plex.metric(session, cluster.router_control_url, "modelplex_router_cache_misses_total") == 4
        assert await plex.metric(session, cluster.router_control_url, "modelplex_router_cache_hits_total") == 16
        for url in cluster.replica_urls.values():
            assert await plex.metric(session, url, "modelplex_model_loads_total") == 2

        view = await plex.table(session, cluster.router_url)
        for model, replicas in served.items():
            holders = [name for name, r in view.items() if model in r["models"]]
            assert holders == list(replicas)


async def test_a_concurrent_burst_for_new_models_loads_each_once(plex):
    cluster = await plex.start(replicas=2, capacity=2, max_ongoing=32)
    models = ["m1", "m2", "m3", "m4"]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        results = await asyncio.gather(*(call(session, cluster.router_url, m) for m in models for _ in range(8)))
        served = defaultdict(set)
        for status, replica, body in results:
            assert status == 200, body
            served[body["model"]].add(replica)
        assert all(len(r) == 1 for r in served.values()), served
        loads = [await plex.metric(session, url, "modelplex_model_loads_total")
                 for url in cluster.replica_urls.values()]
        assert sum(loads) == 4, loads


async def test_the_view_follows_a_load_and_an_eviction_within_a_second(plex):
    cluster = await plex.start(replicas=2, capacity=2)
    replica = cluster.replica_urls["r0"]

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async def models_of_r0():
            return set((await plex.table(session, cluster.router_url))["r0"]["models"])

        # Loads and evictions made directly on the replica, behind the router's back.
        for model in ("x1", "x2"):
            async with session.post(f"{replica}/v1/models/{model}/load") as resp:
                assert resp.status == 200
            await plex.wait_until(lambda m=model: _has(models_of_r0, m), timeout=1.0, interval=0.02,
                                  what=f"{model} to show as loaded")
        async with session.post(f"{replica}/v1/models/x3/load") as resp:  # LRU evicts x1
            assert resp.status == 200
        await plex.wait_until(lambda: _equals(models_of_r0, {"x2", "x3"}), timeout=1.0, interval=0.02,
                              what="the LRU eviction of x1 to show")
        async with session.delete(f"{replica}/v1/models/x2") as resp:
            assert resp.status == 200
        await plex.wait_until(lambda: _equals(models_of_r0, {"x3"}), timeout=1.0, interval=0.02,
                              what="the unload of x2 to show")


async def _has(models, model):
    return model in await models()


async def _equals(models, expected):
    return await models() == expected


async def test_a_hot_model_under_load_ends_up_on_two_replicas(plex):
    # A matching timeout far past the test: only the hot-model spread can place it twice.
    cluster = await plex.start(replicas=2, capacity=2, max_ongoing=2, matching_timeout=60.0)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        replicas = set()
        for _ in range(10):  # bounded: waves of 8 concurrent requests, each holding its slot a while
            results = await asyncio.gather(
                *(call(session, cluster.router_url, "hot", {"sleep": 0.2}) for _ in range(8))
            )
            assert all(status == 200 for status, _, _ in results), results
            replicas |= {replica for _, replica, _ in results}
            if len(replicas) == 2:
                break
        assert replicas == {"r0", "r1"}
        assert await plex.metric(session, cluster.router_control_url, "modelplex_router_fallbacks_total") >= 1
        for url in cluster.replica_urls.values():
            async with session.get(url + "/v1/models") as resp:
                assert "hot" in (await resp.json())["models"]
        view = await plex.table(session, cluster.router_url)
        assert all("hot" in r["models"] for r in view.values()), view


async def test_killing_a_replica_under_load_loses_no_request(plex):
    cluster = await plex.start(replicas=2, capacity=4, max_ongoing=8)
    victim = cluster.replica_procs["r0"]
    total, concurrency = 240, 16
    statuses: list[int] = []
    done_by: Counter = Counter()
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async def worker():
            while not queue.empty():
                i = queue.get_nowait()
                status, replica, body = await call(session, cluster.router_url, f"m{i % 4}", {"sleep": 0.03})
                statuses.append(status)
                done_by[replica] += 1
                if status != 200:
                    print("failed:", status, body)

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        # Kill one replica mid-run, with requests in flight on it.
        await plex.wait_until(lambda: _at_least(statuses, total // 4), timeout=60, what="a quarter of the requests")
        assert done_by["r0"] > 0, done_by
        os.killpg(victim.popen.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*workers), 120)

        assert len(statuses) == total
        assert Counter(statuses) == {200: total}
        assert await plex.metric(session, cluster.router_control_url, "modelplex_router_retries_total") >= 1
        view = await plex.table(session, cluster.router_url)
        assert not view["r0"]["ready"] and view["r1"]["ready"]


async def _at_least(items, n):
    return len(items) >= n


async def test_a_replica_that_refuses_connections_is_skipped(plex):
    # One real replica and one address where nothing listens: every request still succeeds.
    manifest = plex.write_manifest(replicas=2)
    port, dead_port, router_port = plex.free_port(), plex.free_port(), plex.free_port()
    plex.processes.replica(manifest, port)
    plex.processes.router(manifest, router_port, [f"live=http://127.0.0.1:{port}",
                                                  f"dead=http://127.0.0.1:{dead_port}"])
    url = f"http://127.0.0.1:{router_port}"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async def ready():
            async with session.get(url + "/readyz") as resp:
                return resp.status == 200
        await plex.wait_until(ready, what="the router to be ready")
        results = await asyncio.gather(*(call(session, url, f"m{i % 3}") for i in range(30)))
        assert [status for status, _, _ in results] == [200] * 30
        assert {replica for _, replica, _ in results} == {"live"}
