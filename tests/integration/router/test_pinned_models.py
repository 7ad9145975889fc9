"""``spec.models`` ``minCopies``: the router places and leases pinned copies on real replicas."""

from __future__ import annotations

import asyncio
import re
import signal
from collections import Counter
from pathlib import Path

import aiohttp

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.pins import PINS_PATH

from support.stacks import start_local

PINNED = [{"match": "keep", "minCopies": 2}]
FAST_LOADS = {"TEST_LOAD_S": "0.01"}


async def models_on(session: aiohttp.ClientSession, url: str) -> list[str]:
    async with session.get(url + "/v1/models") as resp:
        assert resp.status == 200
        return (await resp.json())["models"]


async def test_a_model_with_min_copies_2_stays_on_both_replicas_through_500_other_ids_and_returns_on_a_replacement(
        plex, session):
    cluster = await plex.start(replicas=2, capacity=2, models=PINNED, replica_env=FAST_LOADS)
    urls = cluster.replica_urls

    async def held_everywhere() -> bool:
        return all(["keep" in await models_on(session, url) for url in urls.values()])

    # Placed by the router alone: nobody asked for "keep".
    await plex.wait_until(held_everywhere, timeout=60, what="'keep' loaded on both replicas")
    async with session.get(cluster.router_control_url + "/metrics") as resp:
        assert 'modelplex_router_pinned_copies{deployment="plex",state="placed"} 2.0' in await resp.text()

    statuses: Counter[int] = Counter()

    async def client(ids) -> None:
        for model in ids:
            async with session.post(f"{cluster.router_url}/v1/models/{model}/predict", json={}) as resp:
                statuses[resp.status] += 1
                assert (await resp.json())["model"] == model

    for round_ in range(10):  # 10 rounds of 50 ids, 8 clients at a time; checked after every round
        ids = iter(f"other-{round_}-{i:02d}" for i in range(50))  # shared: each id is sent once
        await asyncio.gather(*(client(ids) for _ in range(8)))
        assert await held_everywhere(), "a pinned copy was evicted by the burst"
    assert statuses == Counter({200: 500})

    # A replica dies; a replacement starts under its name and address and gets its copy back
    # from the router's placement, without a request for "keep".
    replaced = cluster.replica_procs["r1"]
    plex.processes.stop(replaced, sig=signal.SIGKILL)
    port = int(urls["r1"].rsplit(":", 1)[1])
    plex.processes.replica(cluster.manifest, port, name="replica-r1-replacement", env=FAST_LOADS)

    async def replacement_holds() -> bool:
        try:
            return "keep" in await models_on(session, urls["r1"])
        except aiohttp.ClientError:
            return False

    await plex.wait_until(replacement_holds, timeout=90, what="'keep' on the replacement replica")
    assert await held_everywhere()
    async with session.post(f"{cluster.router_url}/v1/models/keep/predict", json={}) as resp:
        assert resp.status == 200


async def test_a_pin_request_the_replica_cannot_parse_is_a_400_naming_the_field(plex, session):
    cluster = await plex.start(replicas=1, capacity=2)
    url = cluster.replica_urls["r0"] + PINS_PATH
    async with session.post(url, json={"models": ["a"], "ttlSeconds": -1}) as resp:
        assert resp.status == 400
        assert "ttlSeconds" in (await resp.json())["error"]["message"]
    async with session.post(url, json={"models": ["a", "b"], "ttlSeconds": 60, "wait": True}) as resp:
        assert resp.status == 200
        answer = await resp.json()
    assert answer["loaded"] == ["a", "b"] and set(answer["pinned"]) == {"a", "b"} and answer["errors"] == {}
    async with session.post(url, json={"models": ["c"], "wait": True}) as resp:
        assert resp.status == 200
        assert "minCopies" in (await resp.json())["errors"]["c"]  # pins fill both slots
    async with session.delete(cluster.replica_urls["r0"] + "/v1/models/a") as resp:
        assert resp.status == 409  # pinned: not unloaded


async def test_in_local_mode_with_the_internal_credential_the_router_pins_the_declared_copies(plex, session):
    path = plex.write_manifest(name="pins", replicas=2, capacity=2, models=PINNED)
    stack = start_local(plex.processes, path, deployments=1, env=FAST_LOADS)
    (credentials,) = re.findall(r"^deployment credentials: (\S+)/<name>", stack.proc.log.read_text(), flags=re.M)
    internal = {INTERNAL_TOKEN_HEADER: (Path(credentials) / "pins").read_text().strip()}

    async def placed() -> list[dict]:
        async with session.get(stack.url("pins") + "/v1/replicas", headers=internal) as resp:
            assert resp.status == 200
            replicas = (await resp.json())["replicas"]
        return replicas if len(replicas) == 2 and all("keep" in r["models"] for r in replicas) else []

    replicas = await plex.wait_until(placed, timeout=90, what="'keep' on both replicas of modelplex local")
    url = replicas[0]["url"] + PINS_PATH
    async with session.post(url, json={"models": ["other"]}) as resp:
        assert resp.status == 401  # the replica's internal API: only with the credential
    async with session.post(url, json={"models": ["other"], "wait": True}, headers=internal) as resp:
        assert resp.status == 200 and (await resp.json())["loaded"] == ["other"]
