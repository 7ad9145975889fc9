"""A server keeps at most its cap of open connections: one more gets a 503 JSON and is closed;
served connections and ones that have not sent a byte yet both count."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from modelplex.processes import wait_for_async
from modelplex.serving import DEFAULT_MAX_CONNECTIONS, ConnectionLimits, JsonErrorRunner

from support.servers import free_port


async def hello(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def get(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    return reader, writer


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return int(head.split(b" ", 2)[1]), json.loads(await reader.readexactly(length))


async def test_connections_over_the_cap_get_a_503_and_a_freed_one_is_taken_again():
    assert DEFAULT_MAX_CONNECTIONS == 1024
    app = web.Application()
    app.router.add_get("/", hello)
    runner = JsonErrorRunner(app, limits=ConnectionLimits(max_connections=3))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    opened = []
    try:
        for _ in range(2):  # two served keep-alive connections
            reader, writer = await get(port)
            assert await answer(reader) == (200, {"ok": True})
            opened.append(writer)
        _, silent = await asyncio.open_connection("127.0.0.1", port)  # one that sends nothing
        opened.append(silent)
        # The server has taken all three (the silent one too) before the next one is tried.
        await wait_for_async(lambda: len(runner.server.connections) == 3, 10, what="three open connections")
        reader, writer = await get(port)
        status, body = await answer(reader)
        assert status == 503 and body["error"]["code"] == "overloaded"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and closed
        writer.close()
        silent.close()
        await wait_for_async(lambda: len(runner.server.connections) < 3, 10, what="a connection freed")
        reader, writer = await get(port)
        assert await answer(reader) == (200, {"ok": True})
        opened.append(writer)
    finally:
        for writer in opened:
            writer.close()
        await runner.cleanup()


async def _serving(limits: ConnectionLimits) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/", hello)

    async def upload(request: web.Request) -> web.Response:
        return web.json_response({"bytes": len(await request.read())})

    app.router.add_post("/", upload)
    runner = JsonErrorRunner(app, limits=limits)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """The server closed the connection (EOF, no answer) within ``seconds``."""
    try:
        return await asyncio.wait_for(reader.read(), seconds) == b""
    except TimeoutError:
        return False


async def test_a_connection_without_a_whole_request_head_is_closed_unanswered_after_the_header_timeout():
    runner, port = await _serving(ConnectionLimits(header_timeout_s=0.5, idle_timeout_s=60))
    try:
        silent_reader, silent = await asyncio.open_connection("127.0.0.1", port)
        half_reader, half = await asyncio.open_connection("127.0.0.1", port)
        half.write(b"GET / HT")
        await half.drain()
        assert not await closed_within(silent_reader, 0.2)  # not before the timeout
        assert await closed_within(silent_reader, 0.5 + 2)
        assert await closed_within(half_reader, 2)
        reader, writer = await get(port)  # others are served
        assert await answer(reader) == (200, {"ok": True})
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_slow_body_is_not_cut_by_the_header_timeout():
    runner, port = await _serving(ConnectionLimits(header_timeout_s=0.3, idle_timeout_s=60))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        await writer.drain()
        await asyncio.sleep(0.8)  # the head arrived whole: only the body timeout applies now
        writer.write(b"cd")
        assert await answer(reader) == (200, {"bytes": 4})
        writer.close()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("next_head", [b"", b"GET / HTTP/1.1\r\nHo"], ids=["idle", "stalled"])
async def test_a_served_keep_alive_connection_is_closed_when_idle_or_when_its_next_head_stalls(next_head):
    """Idle: kept past the header timeout, closed at the idle one. Half a next head: closed at the
    header timeout, long before the idle one."""
    idle_s = 1.0 if not next_head else 60.0
    runner, port = await _serving(ConnectionLimits(header_timeout_s=0.5, idle_timeout_s=idle_s))
    try:
        reader, writer = await get(port)
        assert await answer(reader) == (200, {"ok": True})
        writer.write(next_head)
        await writer.drain()
        if not next_head:
            assert not await closed_within(reader, 0.7)
        assert await closed_within(reader, min(idle_s, 0.5) + 2)
    finally:
        await runner.cleanup()
