"""A real Envoy balancing by the override-host policy (``envoy.load_balancing_policies.override_host``)
on the picker's ordered fallback list (``spec.router.endpointPicker.fallbacks: 1``): with the
pick's replica gone, Envoy sends the request to the next one of the list, and the picker moves
its lease there. The same stack has a load quota (``spec.router.loadQuota``): spent, it is the
router's 429 JSON with ``Retry-After`` through Envoy, as the router answers it.

Its own stack (the package's Envoy reads the header's one pick): two replicas, a router whose
polls are a minute apart (the replicas are ready before it starts), so that the pick stays on
the replica the test stops until the Gateway's fallback has been seen."""

from __future__ import annotations

import json
import signal
from typing import Iterator

import aiohttp
import pytest

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex_router.config import ENV_POLL_INTERVAL

from support.gateway_stack import TOKENS, Gateway, start_stack
from support.servers import Processes

#: Loads each client may cause: ``carol`` spends it here, ``alice`` loads one model.
BURST = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Gateway]:
    processes = Processes(tmp_path_factory.mktemp("override-host"))
    try:
        yield start_stack(processes, router_spec={"loadQuota": {"loadsPerMinute": 0.01, "burst": BURST}},
                          router_env={ENV_POLL_INTERVAL: "60"}, modes=("NONE",), name="envoy-override-host",
                          load_balancing="override_host", retries=1)
    finally:
        processes.stop_all()


def _as(client: str, model: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[client]}", MODEL_ID_HEADER: model}


async def _stat(session: aiohttp.ClientSession, stack: Gateway, name: str) -> int:
    async with session.get(stack.envoy.admin_url + "/stats", params={"filter": f"^{name}$"}) as answer:
        text = await answer.text()
    values = [int(line.split(":")[1]) for line in text.splitlines() if line.startswith(name + ":")]
    assert values, text
    return values[0]


async def _table(session: aiohttp.ClientSession, stack: Gateway) -> dict[str, dict]:
    async with session.get(stack.router_url + "/v1/replicas",
                           headers={INTERNAL_TOKEN_HEADER: stack.internal_token}) as answer:
        assert answer.status == 200, await answer.text()
        return {r["name"]: r for r in (await answer.json())["replicas"]}


async def test_a_spent_load_quota_is_the_routers_429_json_with_retry_after_through_envoy(stack):
    url = stack.url("NONE")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for index in range(BURST):
            async with session.post(url + "/", json={"x": [1.0] * 16}, headers=_as("carol", f"quota-{index}")) as answer:
                assert answer.status == 200, await answer.text()
        async with session.post(url + "/", json={"x": [1.0] * 16}, headers=_as("carol", "quota-last")) as answer:
            assert answer.status == 429, await answer.text()
            through_envoy = await answer.json()
            assert int(answer.headers["Retry-After"]) >= 1
            assert answer.headers["Content-Type"].startswith("application/json")
        # The router's own HTTP front, for the same client, answers alike.
        async with session.post(stack.router_url + "/", json={"x": [1.0] * 16},
                                headers=_as("carol", "quota-last")) as answer:
            assert answer.status == 429
            at_router = await answer.json()
            assert int(answer.headers["Retry-After"]) >= 1
    assert through_envoy["error"]["code"] == at_router["error"]["code"] == "load_quota_exceeded"
    assert through_envoy.keys() == at_router.keys() and through_envoy["error"].keys() == at_router["error"].keys()


async def test_with_the_picks_replica_gone_envoy_falls_back_to_the_next_of_the_list(stack):
    """The model's holder is stopped; the router has not polled since, so the picker still picks
    it first: Envoy fails to connect there and takes the list's next replica, which serves the
    request (the proof covers it); the picker counts the request on the replica that served."""
    url = stack.url("NONE")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(url + "/", json={"x": [1.0] * 16}, headers=_as("alice", "fallback-m")) as answer:
            assert answer.status == 200, await answer.text()
            holder = (await answer.json())["replica"]
        other = next(name for name in stack.replicas if name != holder)
        failed_before = await _stat(session, stack, "cluster.replicas.upstream_cx_connect_fail")
        Processes.stop(stack.replica_procs[holder], signal.SIGKILL)
        assert (await _table(session, stack))[holder]["ready"]  # the router has not seen it go
        async with session.post(url + "/", json={"steps": 3, "pause": 1.0},
                                headers=_as("alice", "fallback-m")) as answer:
            assert answer.status == 200, await answer.text()
            first = json.loads(await answer.content.readline())
            assert first["step"] == 0
            table = await _table(session, stack)
            # The lease moved to the replica that served (it loads the model there, or serves it).
            assert table[holder]["inflight"] == 0
            assert table[other]["inflight"] + table[other]["waiting_for_load"] == 1, table
            rest = [line async for line in answer.content if line.strip()]
        assert len(rest) == 2
        async with session.post(url + "/", json={"x": [1.0] * 16}, headers=_as("alice", "fallback-m")) as answer:
            assert answer.status == 200, await answer.text()
            assert (await answer.json())["replica"] == other
        assert await _stat(session, stack, "cluster.replicas.upstream_cx_connect_fail") >= failed_before + 1
        assert await _stat(session, stack, "cluster.replicas.upstream_rq_retry") >= 1
