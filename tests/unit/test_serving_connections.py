"""A server keeps at most its cap of open connections: one more gets a 503 JSON and is closed;
served connections and ones that have not sent a byte yet both count."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from modelplex.serving import DEFAULT_MAX_CONNECTIONS, JsonErrorRunner
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
    runner = JsonErrorRunner(app, max_connections=3)
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
        await asyncio.sleep(0.1)
        reader, writer = await get(port)
        status, body = await answer(reader)
        assert status == 503 and body["error"]["code"] == "overloaded"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and closed
        writer.close()
        silent.close()
        await asyncio.sleep(0.2)
        reader, writer = await get(port)
        assert await answer(reader) == (200, {"ok": True})
        opened.append(writer)
    finally:
        for writer in opened:
            writer.close()
        await runner.cleanup()
