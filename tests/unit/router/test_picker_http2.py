"""The picker's lean gRPC server (:mod:`modelplex_router.picker.http2`), driven by grpcio's own
client on loopback: messages both ways, flow control past the windows, statuses and their
messages, limits, cancellation, deadlines, drains and a peer that does not speak HTTP/2."""

from __future__ import annotations

import asyncio
import socket
from typing import AsyncIterator

import grpc
import hpack
import pytest

from modelplex_router.picker.http2 import NOT_FOUND, Call, GrpcError, Http2GrpcServer

ECHO, FAIL, REFUSE, HANG = "/t.T/Echo", "/t.T/Fail", "/t.T/Refuse", "/t.T/Hang"
LIMIT = 8 << 20
DEADLINE_S = 10


class Methods:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.ended = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def echo(self, call: Call) -> None:
        async for message in call:
            call.send(message)

    async def fail(self, call: Call) -> None:
        raise RuntimeError("a handler's own bug")

    async def refuse(self, call: Call) -> None:
        raise GrpcError(NOT_FOUND, "no model ü 100% here")

    async def hang(self, call: Call) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            self.ended.set()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Http2GrpcServer, Methods, grpc.aio.Channel]]:
    methods = Methods()
    server = Http2GrpcServer({ECHO: methods.echo, FAIL: methods.fail, REFUSE: methods.refuse, HANG: methods.hang},
                             max_message_bytes=LIMIT)
    await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}",
                                             options=[("grpc.max_receive_message_length", -1),
                                                      ("grpc.max_send_message_length", -1)]) as channel:
            yield server, methods, channel
    finally:
        await server.stop(0)


def _stream(channel: grpc.aio.Channel, method: str) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(method, request_serializer=None, response_deserializer=None)


async def test_messages_come_back_in_order_on_many_streams_at_once(served):
    _, _, channel = served

    async def one(n: int) -> list[bytes]:
        call = _stream(channel, ECHO)(timeout=DEADLINE_S)
        answers = []
        for i in range(5):
            await call.write(f"{n}:{i}".encode())
            answers.append(await call.read())
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        return answers

    results = await asyncio.gather(*(one(n) for n in range(50)))
    assert results == [[f"{n}:{i}".encode() for i in range(5)] for n in range(50)]


async def test_messages_larger_than_both_sides_windows_pass_intact(served):
    _, _, channel = served
    big = bytes(range(256)) * (3 << 12)  # 3 MiB: past our stream window and grpcio's own
    call = _stream(channel, ECHO)(timeout=DEADLINE_S)
    for _ in range(3):
        await call.write(big)
        assert await call.read() == big
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK


async def test_a_message_over_the_limit_ends_the_call_resource_exhausted(served):
    _, _, channel = served
    call = _stream(channel, ECHO)(timeout=DEADLINE_S)
    await call.write(b"x" * (LIMIT + 1))
    assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(LIMIT) in await call.details()


async def test_an_unknown_method_is_unimplemented_and_a_refusal_keeps_its_status_and_message(served):
    _, _, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await channel.unary_unary("/t.T/Nothing")(b"", timeout=DEADLINE_S)
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await channel.unary_unary(REFUSE)(b"", timeout=DEADLINE_S)
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.NOT_FOUND, "no model ü 100% here")


async def test_a_handlers_bug_is_an_internal_error_that_does_not_show_the_bug(served):
    _, _, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await channel.unary_unary(FAIL)(b"", timeout=DEADLINE_S)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert "bug" not in failed.value.details()


async def test_a_client_that_goes_away_cancels_its_handler(served):
    _, methods, channel = served
    call = _stream(channel, HANG)(timeout=DEADLINE_S)
    await call.write(b"x")
    await asyncio.wait_for(methods.started.wait(), DEADLINE_S)
    call.cancel()
    await asyncio.wait_for(methods.cancelled.wait(), DEADLINE_S)


async def test_the_deadline_a_client_gives_ends_the_handler(served):
    _, methods, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await channel.unary_unary(HANG)(b"", timeout=0.3)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(methods.cancelled.wait(), DEADLINE_S)


async def test_a_drain_lets_calls_in_flight_finish_and_takes_no_new_ones(served):
    server, _, channel = served
    call = _stream(channel, ECHO)(timeout=DEADLINE_S)
    await call.write(b"before")
    assert await call.read() == b"before"
    stopping = asyncio.create_task(server.stop(DEADLINE_S))
    await asyncio.sleep(0.2)
    await call.write(b"during")  # the stream in flight goes on
    assert await call.read() == b"during"
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
    await asyncio.wait_for(stopping, DEADLINE_S)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await channel.unary_unary(ECHO)(b"after", timeout=2)
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_a_peer_that_does_not_speak_http2_is_told_why_and_closed(served):
    server, _, _ = served
    loop = asyncio.get_running_loop()
    with socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE_S) as peer:
        peer.setblocking(False)
        await loop.sock_sendall(peer, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while chunk := await asyncio.wait_for(loop.sock_recv(peer, 4096), DEADLINE_S):
            received += chunk
    assert b"not an HTTP/2 connection preface" in received  # in the GOAWAY frame's debug data


class RawPeer:
    """An HTTP/2 client written frame by frame, for what a well-behaved client never sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        # One of each per connection: the peer's header tables stay in step with the server's.
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()

    @classmethod
    async def connect(cls, port: int) -> RawPeer:
        peer = cls(*await asyncio.open_connection("127.0.0.1", port))
        peer.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        peer.frame(4, 0, 0)  # SETTINGS, all defaults
        return peer

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def frame(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.send(len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload)

    def call(self, stream: int, path: str, **more: bytes) -> None:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                  ("content-type", "application/grpc"), ("te", "trailers"), *more.items()]
        self.frame(1, 0x4, stream, self.encoder.encode(fields))  # HEADERS, END_HEADERS

    async def until_stream_ends(self, stream: int) -> tuple[list[bytes], dict[str, str]]:
        """The messages and the trailers (or ``{"reset": code}``) of ``stream``."""
        messages, data = [], b""
        while True:
            head = await asyncio.wait_for(self.reader.readexactly(9), DEADLINE_S)
            length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
            stream_id = int.from_bytes(head[5:9], "big")
            payload = await self.reader.readexactly(length)
            if stream_id != stream:
                continue
            if kind == 0:  # DATA
                data += payload
                while len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[1:5], "big"):
                    size = int.from_bytes(data[1:5], "big")
                    messages.append(data[5:5 + size])
                    data = data[5 + size:]
            elif kind == 1:  # HEADERS
                fields = {k.decode(): v.decode() for k, v in self.decoder.decode(payload, raw=True)}
                if flags & 0x1:
                    return messages, fields
            elif kind == 3:  # RST_STREAM
                return messages, {"reset": str(int.from_bytes(payload, "big"))}


async def test_a_header_value_that_is_not_utf8_is_read_as_bytes_not_a_broken_connection(served):
    server, _, _ = served
    peer = await RawPeer.connect(server.port)
    peer.call(1, ECHO, **{"x-name": b"caf\xe9"})
    peer.frame(0, 0x1, 1, b"\x00\x00\x00\x00\x02hi")  # DATA, END_STREAM: one message
    messages, trailers = await peer.until_stream_ends(1)
    assert (messages, trailers["grpc-status"]) == ([b"hi"], "0")
    peer.writer.close()


async def test_a_peer_that_overruns_the_window_it_was_given_loses_that_stream(served):
    server, methods, _ = served
    peer = await RawPeer.connect(server.port)
    peer.call(1, HANG)  # a handler that reads nothing: once 1 MiB waits unread, no credit comes back
    message = (16_384 - 5).to_bytes(5, "big") + b"\x00" * (16_384 - 5)  # one whole message a frame
    for _ in range(3 * 64):  # 3 MiB, whatever came back: past any window it could have had
        peer.frame(0, 0, 1, message)
    _, trailers = await peer.until_stream_ends(1)
    assert trailers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    await asyncio.wait_for(methods.ended.wait(), DEADLINE_S)
    peer.writer.close()


async def test_the_server_ends_a_call_at_its_grpc_timeout_even_when_the_client_does_not(served):
    """A raw peer that sends ``grpc-timeout`` and keeps waiting: the server's own deadline ends
    the call (grpcio's client would have reset it itself, which the test above covers)."""
    server, methods, _ = served
    peer = await RawPeer.connect(server.port)
    peer.call(1, HANG, **{"grpc-timeout": b"200m"})
    _, trailers = await peer.until_stream_ends(1)
    assert trailers["grpc-status"] == "4"  # DEADLINE_EXCEEDED
    await asyncio.wait_for(methods.cancelled.wait(), DEADLINE_S)
    peer.writer.close()
