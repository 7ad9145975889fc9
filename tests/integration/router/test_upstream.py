"""The router's client to its replicas (:mod:`modelplex_router.upstream`) against real aiohttp
servers on loopback: keep-alive, chunk framing, flow control, failures, the credential."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from modelplex.http import first_chunk, upstream_chunks
from modelplex.processes import free_port
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, DeploymentCredential, TokenFile, write_token_file
from modelplex_router import upstream
from modelplex_router.upstream import UpstreamPool


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def app(*routes: web.RouteDef) -> web.Application:
    application = web.Application()
    application.add_routes(routes)
    return application


async def served(application: web.Application) -> TestServer:
    server = TestServer(application, host="127.0.0.1")
    await server.start_server()
    return server


async def peer(request: web.Request) -> web.Response:
    """Which client port sent the request, and what came with it."""
    body = await request.read()
    return web.json_response({"port": request.transport.get_extra_info("peername")[1], "bytes": len(body),
                              "token": request.headers.get(INTERNAL_TOKEN_HEADER),
                              "type": request.headers.get("Content-Type")})


async def test_requests_in_turn_share_one_connection_and_the_answer_arrives_whole():
    server = await served(app(web.post("/v1/invoke", peer)))
    pool = UpstreamPool(connect_timeout_s=5)
    try:
        url = server.make_url("/v1/invoke")
        ports = []
        for size in (0, 10, 1 << 20):
            answer = await pool.request("POST", url, data=os.urandom(size), headers={"Content-Type": "x/y"})
            assert answer.status == 200 and answer.reason == "OK"
            assert answer.content_type == "application/json" and answer.content_length is not None
            document = json.loads(await answer.read())
            assert answer.content.at_eof()
            answer.release()
            assert document["bytes"] == size and document["type"] == "x/y" and document["token"] is None
            ports.append(document["port"])
        assert len(set(ports)) == 1, ports
    finally:
        await pool.close()
        await server.close()


async def test_each_http_chunk_is_handed_over_whole_and_never_merged_with_the_next():
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        # Written back to back: they reach the client in one segment, as three HTTP chunks.
        for item in (b"one\n", b"two two\n", b"x" * 70_000):
            await response.write(item)
        await asyncio.sleep(0.05)
        await response.write(b"late\n")
        await response.write_eof()
        return response

    server = await served(app(web.get("/s", stream)))
    pool = UpstreamPool(connect_timeout_s=5)
    try:
        answer = await pool.request("GET", server.make_url("/s"))
        assert answer.status == 200 and answer.content_length is None
        first = await first_chunk(answer.content)
        rest = [chunk async for chunk in upstream_chunks(answer.content)]
        assert [first, *rest] == [b"one\n", b"two two\n", b"x" * 70_000, b"late\n"]
        answer.release()
    finally:
        await pool.close()
        await server.close()


async def test_an_unread_answer_never_goes_back_to_the_pool_and_an_idle_one_expires():
    server = await served(app(web.post("/", peer)))
    clock = Clock()
    pool = UpstreamPool(connect_timeout_s=5, idle_timeout_s=30, clock=clock)
    url = server.make_url("/")

    async def port() -> int:
        answer = await pool.request("POST", url)
        document = json.loads(await answer.read())
        answer.release()
        return document["port"]

    try:
        first = await port()
        assert await port() == first  # kept
        unread = await pool.request("POST", url)
        unread.release()  # its body not read: closed
        after_unread = await port()
        assert after_unread != first
        clock.now += 31  # idle past idle_timeout_s
        assert await port() != after_unread
    finally:
        await pool.close()
        await server.close()


async def test_a_refused_connection_and_a_replica_that_dies_mid_answer_raise_the_proxys_failures():
    pool = UpstreamPool(connect_timeout_s=5)
    with pytest.raises(aiohttp.ClientConnectionError):
        await pool.request("POST", URL(f"http://127.0.0.1:{free_port()}/v1/invoke"))

    async def dies(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"partial")
        request.transport.close()  # mid-stream: no last chunk
        return response

    async def dies_at_once(request: web.Request) -> web.Response:
        request.transport.close()  # before its status line
        return web.Response()

    server = await served(app(web.post("/mid", dies), web.post("/before", dies_at_once)))
    try:
        with pytest.raises(aiohttp.ClientConnectionError):
            await pool.request("POST", server.make_url("/before"))
        answer = await pool.request("POST", server.make_url("/mid"))
        assert await first_chunk(answer.content) == b"partial"
        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)):
            async for _ in upstream_chunks(answer.content):
                pass
        answer.close()
    finally:
        await pool.close()
        await server.close()


async def test_the_internal_credential_goes_with_every_request_and_a_refusal_retries_with_the_fallback(tmp_path):
    seen = []

    async def guarded(request: web.Request) -> web.Response:
        token = request.headers.get(INTERNAL_TOKEN_HEADER)
        seen.append((token, len(await request.read())))
        if token != "old-namespace-token":
            return web.json_response({"error": "no"}, status=401)
        return web.Response(text="in")

    own = write_token_file(tmp_path / "own", "deployment-token")
    legacy = write_token_file(tmp_path / "legacy", "old-namespace-token")
    # During an upgrade a pod sends the namespace's token first and its own where that is refused;
    # here the replica takes only the namespace's: the same request is sent twice, body and all.
    credential = DeploymentCredential(legacy, TokenFile(own))
    server = await served(app(web.post("/", guarded)))
    pool = UpstreamPool(connect_timeout_s=5, credential=credential)
    try:
        answer = await pool.request("POST", server.make_url("/"), data=b"12345")
        assert answer.status == 200 and await answer.read() == b"in"
        answer.release()
        assert seen[0][1] == 5 and seen[-1] == ("old-namespace-token", 5)
    finally:
        await pool.close()
        await server.close()


async def test_a_slow_reader_pauses_the_replicas_connection_instead_of_buffering_its_answer():
    total = 8 << 20

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(total // (64 << 10)):
            await response.write(b"z" * (64 << 10))
        await response.write_eof()
        return response

    server = await served(app(web.get("/big", big)))
    pool = UpstreamPool(connect_timeout_s=5)
    try:
        answer = await pool.request("GET", server.make_url("/big"))
        await asyncio.sleep(0.5)  # nobody reads: the connection stops reading
        assert answer.content._size <= upstream.PAUSE_BYTES + (256 << 10), answer.content._size
        received = sum([len(chunk) async for chunk in upstream_chunks(answer.content)])
        assert received == total
        answer.release()
    finally:
        await pool.close()
        await server.close()


async def test_a_newline_in_a_header_is_refused_and_any_other_text_goes_on_as_the_client_sent_it():
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"value": request.headers["X-Request-Id"]})

    pool = UpstreamPool(connect_timeout_s=5)
    server = await served(app(web.post("/", peer), web.post("/echo", echo)))
    try:
        with pytest.raises(ValueError, match="control character"):
            await pool.request("POST", server.make_url("/"), headers={"X-Request-Id": "a\r\nX-Evil: 1"})
        # UTF-8 text, and a byte that is not UTF-8 as aiohttp's server hands it on (a surrogate escape).
        for value in ("café €", "caf\udce9"):
            answer = await pool.request("POST", server.make_url("/echo"), headers={"X-Request-Id": value})
            assert answer.status == 200 and json.loads(await answer.read())["value"] == value
            answer.release()
    finally:
        await pool.close()
        await server.close()


async def test_an_https_replica_is_reached_over_tls_and_one_with_an_untrusted_certificate_is_refused(tmp_path,
                                                                                                  monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(app(web.post("/", peer)))
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=context)
    await site.start()
    url = URL(f"https://127.0.0.1:{port}/")
    try:
        pool = UpstreamPool(connect_timeout_s=5)
        with pytest.raises(aiohttp.ClientConnectionError, match="certificate"):
            await pool.request("POST", url)
        await pool.close()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the default context trusts it now
        pool = UpstreamPool(connect_timeout_s=5)
        answer = await pool.request("POST", url, data=b"abc")
        assert answer.status == 200 and json.loads(await answer.read())["bytes"] == 3
        answer.release()
        await pool.close()
    finally:
        await runner.cleanup()
