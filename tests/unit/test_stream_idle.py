"""A stream's writes are bounded by the stream idle timeout (``modelplex.http.write_chunk``): a
client that stops reading is cut (``StreamIdle``) and its connection closed, while a producer's
own silence between chunks, however long, is not idleness. A real aiohttp server on loopback and
raw socket clients."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from modelplex.http import StreamIdle, write_chunk

from support.servers import free_port

IDLE_S = 0.5


async def serving(handler) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def test_a_client_that_stops_reading_is_cut_after_the_idle_timeout_and_its_connection_closed():
    outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            while True:
                await write_chunk(request, response, b"x" * 65536, IDLE_S)
        except StreamIdle as error:
            outcome.set_result(error)
            raise

    runner, port = await serving(endless)
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)  # the server runs on this loop: the client never blocks it
    try:
        await loop.sock_connect(client, ("127.0.0.1", port))
        await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await loop.sock_recv(client, 64)).startswith(b"HTTP/1.1 200")  # then it reads no more
        error = await asyncio.wait_for(outcome, IDLE_S + 10)
        assert isinstance(error, ConnectionResetError) and "streamIdleTimeoutSeconds" in str(error)
        # Aborted: what the client finds is a cut, never the end of a complete answer.
        data = b""
        try:
            while chunk := await asyncio.wait_for(loop.sock_recv(client, 1 << 20), 10):
                data += chunk
        except ConnectionResetError:
            pass
        assert not data.endswith(b"0\r\n\r\n")
    finally:
        client.close()
        await runner.cleanup()


async def test_a_producer_silent_longer_than_the_idle_timeout_is_not_cut():
    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for index in range(3):
            await asyncio.sleep(IDLE_S * 2)  # the producer thinks; the client reads all it is sent
            await write_chunk(request, response, f"chunk {index}\n".encode(), IDLE_S)
        await response.write_eof()
        return response

    runner, port = await serving(slow)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200")
        assert all(f"chunk {index}".encode() in answer for index in range(3)) and answer.endswith(b"0\r\n\r\n")
    finally:
        await runner.cleanup()
