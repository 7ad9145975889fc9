"""The replica's ASGI bridge (``serve.ingress``): a real replica app on loopback, its ASGI app a
plain callable (no framework), requests sent as the router forwards them."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from modelplex.serve.ingress import ingress
from modelplex.wire.codec import CALL_CONTENT_TYPE, Call, decode_value, encode_call
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX, METHOD_HEADER, PATH_HEADER
from modelplex.wire.spec import parse_deployment
from modelplex_replica.app import create_app

DEPLOYMENT = parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                               "metadata": {"name": "api"}, "spec": {"image": "x", "handler": "m:Api"}})


async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        assert (await receive())["type"] == "lifespan.startup"
        scope["state"]["greeting"] = "hello"
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = (await receive())["body"]
    path = scope["path"]
    if path.endswith("/fails-first"):
        raise ValueError("no answer for you")
    if path.endswith("/fails-midway"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"part one\n", "more_body": True})
        raise RuntimeError("broke off")
    answer = (f"{scope['method']} {path} root={scope['root_path']} query={scope['query_string'].decode()} "
              f"state={scope['state']['greeting']} body={body.decode()}").encode()
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-type", b"text/plain"), (b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]})
    await send({"type": "http.response.body", "body": answer})


@ingress(asgi_app)
class Api:
    def double(self, value: int) -> int:
        return 2 * value


@pytest.fixture
async def replica(monkeypatch):
    monkeypatch.setenv(ENV_ROUTE_PREFIX, "/api")
    server = TestServer(create_app(DEPLOYMENT, Api()), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(str(server.make_url("")),
                                         timeout=aiohttp.ClientTimeout(total=30)) as session:
            yield session
    finally:
        await server.close()


def sent_as(method: str, path: str) -> dict[str, str]:
    return {METHOD_HEADER: method, PATH_HEADER: path}


async def test_the_app_gets_the_request_as_the_client_sent_it_under_the_route_prefix(replica):
    async with replica.post("/v1/invoke", data=b"payload", headers=sent_as("PATCH", "/api/items/a%20b?x=1")) as response:
        assert response.status == 201
        assert await response.text() == "PATCH /api/items/a b root=/api query=x=1 state=hello body=payload"
        assert response.headers.getall("Set-Cookie") == ["a=1", "b=2"]
        assert "X-Modelplex-Loaded-Models" in response.headers


async def test_a_path_outside_the_prefix_is_a_404_that_names_the_prefix(replica):
    async with replica.post("/v1/invoke", headers=sent_as("GET", "/apix")) as response:
        assert response.status == 404
        assert "answers under /api" in (await response.json())["error"]["message"]


async def test_a_request_from_the_routers_own_api_reaches_the_app_at_its_root(replica):
    async with replica.post("/v1/invoke", data=b"x") as response:  # /v1/models/{m}/predict: no path sent
        assert (response.status, await response.text()) == (201, "POST / root=/api query= state=hello body=x")


async def test_an_app_that_fails_before_answering_is_a_500_naming_the_error(replica):
    async with replica.post("/v1/invoke", headers=sent_as("GET", "/api/fails-first")) as response:
        error = (await response.json())["error"]
        assert response.status == 500 and error["type"] == "ValueError" and "no answer for you" in error["message"]


async def test_an_app_that_fails_midway_cuts_the_response(replica):
    async with replica.post("/v1/invoke", headers=sent_as("GET", "/api/fails-midway")) as response:
        assert response.status == 200
        assert await response.content.readline() == b"part one\n"
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_a_handle_calls_the_classs_method_whatever_the_prefix(replica):
    body = encode_call(Call("double", (21,), {}))
    async with replica.post("/v1/invoke", data=body, headers={"Content-Type": CALL_CONTENT_TYPE}) as response:
        assert response.status == 200 and decode_value(await response.read()) == 42


async def test_a_failed_lifespan_startup_fails_the_replicas_start():
    async def failing(scope, receive, send):
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no weights"})

    @ingress(failing)
    class Broken:
        def method(self):
            return 1

    server = TestServer(create_app(DEPLOYMENT, Broken()), host="127.0.0.1")
    with pytest.raises(RuntimeError, match="startup failed: no weights"):
        await asyncio.wait_for(server.start_server(), 30)
    await server.close()


async def test_an_ingress_stream_whose_client_stops_reading_is_cut_after_the_stream_idle_timeout(monkeypatch):
    """A streaming ingress app whose client reads nothing for streamIdleTimeoutSeconds: the
    replica cuts the stream and cancels the app (its slot is free again)."""
    monkeypatch.setenv(ENV_ROUTE_PREFIX, "/api")
    cancelled = asyncio.Event()

    async def flood(scope, receive, send):
        if scope["type"] == "lifespan":
            assert (await receive())["type"] == "lifespan.startup"
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        try:
            for step in range(1_000_000):
                await send({"type": "http.response.body", "body": bytes([step % 256]) * 65536, "more_body": True})
        finally:
            cancelled.set()

    @ingress(flood)
    class Flood:
        def method(self):
            return 1

    deployment = parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                                   "metadata": {"name": "flood"},
                                   "spec": {"image": "x", "handler": "m:Flood",
                                            "router": {"streamIdleTimeoutSeconds": 0.5}}})
    server = TestServer(create_app(deployment, Flood()), host="127.0.0.1")
    await server.start_server()
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)  # the replica runs on this loop: the client never blocks it
    try:
        await loop.sock_connect(client, ("127.0.0.1", server.port))
        await loop.sock_sendall(client, f"POST /v1/invoke HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                                        f"{METHOD_HEADER}: GET\r\n{PATH_HEADER}: /api/flood\r\n\r\n".encode())
        assert (await loop.sock_recv(client, 64)).startswith(b"HTTP/1.1 200")  # then it reads no more
        await asyncio.wait_for(cancelled.wait(), 0.5 + 10)
    finally:
        client.close()
        await server.close()
