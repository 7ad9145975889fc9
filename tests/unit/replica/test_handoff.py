"""Invoke connections served on the user-code loop (handoff.py): a real replica app behind the
process's own runner (``modelplex.serving.JsonErrorRunner``) on loopback, as ``modelplex
replica`` serves it, and real HTTP clients."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from modelplex.serving import JsonErrorRunner
from modelplex.wire.spec import parse_deployment
from modelplex_replica.app import STATE, create_app

DEPLOYMENT = parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                               "metadata": {"name": "echo"}, "spec": {"image": "x", "handler": "m:Echo"}})


class Echo:
    async def __call__(self, body):
        if body.get("block_s"):
            time.sleep(body["block_s"])  # synchronous work inside async def, as users write it
        return {"size": len(body.get("data", "")), "thread": threading.current_thread().name}


class Streamer:
    async def __call__(self, body):
        for i in range(body["chunks"]):
            yield {"i": i, "thread": threading.current_thread().name}


async def _serve(handler):
    app = create_app(DEPLOYMENT, handler)
    runner = JsonErrorRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}", app[STATE].connections


@pytest.fixture
async def echo():
    runner, url, connections = await _serve(Echo())
    try:
        yield url, connections
    finally:
        await runner.cleanup()


def _one_connection() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=30))


async def test_a_connection_that_opens_with_an_invoke_moves_to_the_user_loop_and_stays_usable(echo):
    url, connections = echo
    async with _one_connection() as session:
        for _ in range(3):  # one connection, kept alive: moved once
            async with session.post(url + "/v1/invoke", json={"data": "abc"}) as response:
                assert response.status == 200
                assert await response.json() == {"size": 3, "thread": "modelplex-user-code"}
        async with session.get(url + "/readyz") as response:  # the same connection, now on the user loop
            assert response.status == 200
    assert connections.moved == 1


async def test_a_connection_that_opens_with_anything_else_stays_on_the_server_loop_and_still_invokes(echo):
    url, connections = echo
    async with _one_connection() as session:
        async with session.get(url + "/healthz") as response:
            assert response.status == 200
        async with session.post(url + "/v1/invoke", json={"data": "abcd"}) as response:  # through the hop
            assert await response.json() == {"size": 4, "thread": "modelplex-user-code"}
    assert connections.moved == 0


async def test_a_body_far_larger_than_the_first_read_arrives_whole_and_in_order(echo):
    url, connections = echo
    data = "".join(chr(65 + i % 26) for i in range(3_000_000))
    async with _one_connection() as session:
        async with session.post(url + "/v1/invoke", json={"data": data}) as response:
            assert response.status == 200
            assert (await response.json())["size"] == len(data)
    assert connections.moved == 1


async def test_a_stream_on_a_moved_connection_arrives_whole():
    runner, url, connections = await _serve(Streamer())
    try:
        async with _one_connection() as session:
            async with session.post(url + "/v1/invoke", json={"chunks": 50}) as response:
                lines = [line async for line in response.content]
        assert [int(line.split(b'"i":')[1].split(b",")[0]) for line in lines] == list(range(50))
        assert connections.moved == 1
    finally:
        await runner.cleanup()


async def test_readiness_is_answered_while_a_moved_connections_handler_blocks_its_loop(echo):
    url, connections = echo
    async with _one_connection() as invoking, _one_connection() as probing:
        blocked = asyncio.ensure_future(invoking.post(url + "/v1/invoke", json={"block_s": 3.0}))
        await asyncio.sleep(0.2)  # the handler is blocking the user loop now
        async with probing.get(url + "/readyz") as response:
            assert response.status == 200
        assert not blocked.done()  # answered while user code still held its loop
        response = await blocked
        assert response.status == 200
        response.release()
    assert connections.moved == 1
