"""The router's own answers, in-process: a started Router, its HTTP front served by aiohttp's test
server on loopback, found replicas through static discovery (a process adds nothing these tests check;
tests/integration/router runs it as a process, with real replicas)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from modelplex.processes import free_port, wait_for_async
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.spec import parse_deployment
from modelplex_router.app import create_app
from modelplex_router.config import ENV_QUEUE_TIMEOUT, RouterConfig
from modelplex_router.discovery.static import StaticDiscovery
from modelplex_router.router import Router


def deployment():
    return parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                             "metadata": {"name": "plex"},
                             "spec": {"replicas": 1, "image": "local", "handler": "handlers:Echo"}})


@pytest.fixture
async def router_with_nobody() -> AsyncIterator[TestClient]:
    """A router whose one replica address has nothing listening (waits bounded at 1 s)."""
    config = RouterConfig.from_deployment(deployment(), env={ENV_QUEUE_TIMEOUT: "1"})
    discovery = StaticDiscovery([f"http://127.0.0.1:{free_port()}"], interval_s=config.poll_interval_s)
    async with Router(config, discovery) as router:
        client = TestClient(TestServer(create_app(router), host="127.0.0.1"))
        await client.start_server()
        try:
            yield client
        finally:
            await client.close()


async def error_of(response) -> dict:
    body = await response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]


async def test_no_replica_ready_is_a_503_json_with_retry_after(router_with_nobody):
    client = router_with_nobody

    async def polled() -> bool:  # discovery has tried the replica: the table knows it
        async with client.get("/v1/replicas") as response:
            return bool((await response.json())["replicas"])

    await wait_for_async(polled, timeout=30, what="the replica in the router's table")
    async with client.get("/healthz") as response:
        assert response.status == 200  # alive, though nothing can be served
    async with client.get("/readyz") as response:
        assert response.status == 503
    async with client.post("/", json={}, headers={MODEL_ID_HEADER: "m"}) as response:
        assert response.status == 503 and response.headers.get("Retry-After")
        assert (await error_of(response))["code"] == "not_ready"
    async with client.get("/v1/replicas") as response:
        assert [r["ready"] for r in (await response.json())["replicas"]] == [False]


async def test_a_replica_that_refuses_for_a_while_is_tried_again_with_growing_waits_until_it_answers():
    # A replica that took a burst of requests whose loads ended at once refuses (503) until they
    # are through: the router waits and tries again (50 ms, doubling), within the request's bound.
    refusing_for_s, tries = 1.2, []

    async def invoke(request):
        tries.append(asyncio.get_running_loop().time())
        if tries[-1] - tries[0] < refusing_for_s:
            return web.json_response({"error": {"code": "overloaded", "message": "full"}}, status=503,
                                     headers={"Retry-After": "1"})
        return web.json_response({"ok": True})

    async def models(request):
        return web.json_response(LoadedModels(version=1, capacity=4, models=("m",)).to_dict())

    replica = web.Application()
    replica.add_routes([web.post("/v1/invoke", invoke), web.get("/v1/models", models),
                        web.get("/readyz", lambda request: web.json_response({"ready": True}))])
    runner = web.AppRunner(replica)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    config = RouterConfig.from_deployment(deployment(), env={ENV_QUEUE_TIMEOUT: "10"})
    plex = Router(config, StaticDiscovery([f"http://127.0.0.1:{port}"], interval_s=config.poll_interval_s))
    await plex.start()
    router = TestClient(TestServer(create_app(plex), host="127.0.0.1"))
    await router.start_server()
    try:
        async def ready() -> bool:
            async with router.get("/readyz") as response:
                return response.status == 200

        await wait_for_async(ready, timeout=30, what="the router ready")
        async with router.post("/", json={}, headers={MODEL_ID_HEADER: "m"}) as response:
            assert response.status == 200, await response.text()
            assert await response.json() == {"ok": True}
        # Waits of 0.05 + 0.1 + 0.2 + 0.4 + 0.8 s: the 6th try is past 1.2 s (at a fixed 50 ms, ~25
        # tries). A slow machine only makes fewer.
        assert len(tries) <= 7, tries
    finally:
        await router.close()
        await plex.close()
        await runner.cleanup()
