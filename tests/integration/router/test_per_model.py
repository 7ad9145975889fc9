"""Per-model service at the router with real replicas: ``x-modelplex-on-cold: reject`` and
load quotas per client. Every process is real and on loopback; every wait is bounded."""

from __future__ import annotations

import time

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

TIMEOUT = aiohttp.ClientTimeout(total=60)
#: The handler's load time here: long enough that "at once" and "after the load" differ.
LOAD_S = 2.0


async def call(session: aiohttp.ClientSession, url: str, model: str,
               on_cold: str | None = None) -> tuple[int, dict, aiohttp.typedefs.LooseHeaders]:
    headers = {MODEL_ID_HEADER: model}
    if on_cold:
        headers["x-modelplex-on-cold"] = on_cold
    async with session.post(url + "/", json={}, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None), resp.headers


async def loaded_models(session: aiohttp.ClientSession, replica_urls: dict[str, str]) -> dict[str, set[str]]:
    """What each replica says it has loaded (its own /v1/models, not the router's view)."""
    held = {}
    for name, url in replica_urls.items():
        async with session.get(url + "/v1/models") as resp:
            assert resp.status == 200
            held[name] = {m["id"] if isinstance(m, dict) else m for m in (await resp.json())["models"]}
    return held


async def test_a_request_that_will_not_wait_for_a_load_gets_503_at_once_and_a_load_starts(plex):
    cluster = await plex.start(replicas=2, replica_env={"TEST_LOAD_S": str(LOAD_S)})
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        started = time.monotonic()
        status, body, headers = await call(session, cluster.router_url, "cold-model", on_cold="reject")
        assert time.monotonic() - started < LOAD_S  # not held for the load
        assert status == 503, body
        assert body["error"]["code"] == "model_not_loaded" and int(headers["Retry-After"]) >= 1

        async def held_somewhere() -> bool:
            return any("cold-model" in models for models in (await loaded_models(session, cluster.replica_urls)).values())

        await plex.wait_until(held_somewhere, timeout=30, what="the background load of cold-model")
        held = await loaded_models(session, cluster.replica_urls)
        assert sum("cold-model" in models for models in held.values()) == 1  # loaded once, on one replica

        async def answered() -> bool:  # the router learns of the load within its poll interval
            status, body, _ = await call(session, cluster.router_url, "cold-model", on_cold="reject")
            return status == 200 and body["model"] == "cold-model"

        await plex.wait_until(answered, timeout=30, what="a retry to find the loaded model")
        status, body, _ = await call(session, cluster.router_url, "typo", on_cold="later")
        assert status == 400 and "x-modelplex-on-cold" in body["error"]["message"]
        assert await plex.metric(session, cluster.router_control_url, "modelplex_router_cold_rejections_total") >= 1


async def test_a_client_over_its_load_quota_gets_429_and_no_load_while_loaded_models_answer(plex):
    cluster = await plex.start(replicas=2, spec={"router": {"loadQuota": {"loadsPerMinute": 1, "burst": 1}}})
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        status, body, _ = await call(session, cluster.router_url, "first")  # the one load of the burst
        assert status == 200 and body["model"] == "first"

        status, body, headers = await call(session, cluster.router_url, "second")
        assert status == 429, body
        assert body["error"]["code"] == "load_quota_exceeded" and int(headers["Retry-After"]) >= 1
        status, body, _ = await call(session, cluster.router_url, "second", on_cold="reject")
        assert status == 429, body  # reject starts no load past the quota either

        for _ in range(5):  # a model a replica holds never counts against the quota
            status, body, _ = await call(session, cluster.router_url, "first")
            assert status == 200 and body["model"] == "first"
        held = await loaded_models(session, cluster.replica_urls)
        assert not any("second" in models for models in held.values()), held
        assert await plex.metric(session, cluster.router_control_url, "modelplex_router_load_quota_refusals_total") == 2


async def test_with_reject_a_model_no_replica_can_find_answers_404_once_its_load_came_back_404(plex):
    cluster = await plex.start(replicas=1)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        status, body, _ = await call(session, cluster.router_url, "missing-model", on_cold="reject")
        assert status == 503 and body["error"]["code"] == "model_not_loaded", body

        async def not_found() -> dict | None:
            status, body, _ = await call(session, cluster.router_url, "missing-model", on_cold="reject")
            assert status in (503, 404), body
            return body if status == 404 else None

        # The background load's 404 is remembered: reject answers 404 naming the model, not
        # "a load has started, retry later" for ever.
        body = await plex.wait_until(not_found, timeout=30, interval=0.1, what="reject to answer 404")
        assert body["error"]["code"] == "model_not_found" and "'missing-model'" in body["error"]["message"]
