"""A lean gRPC server over HTTP/2 cleartext for the picker's port: one asyncio protocol per
connection, on the router's event loop, nothing else in between.

Why not grpcio: its asyncio server polls its completion queue on a thread of its own and hands
every message to the event loop through an eventfd, and its per-message Python costs about three
times this module's (``bench/gateway/floor.py``, a server that decides nothing: 478 against 152 µs
of CPU a stream at c=32, +0.86 against +0.58 ms p50 over Envoy-direct one request at a time). An Endpoint Picker answers
two or three small messages per HTTP request a Gateway passes, so that cost is most of its cost.

What it implements, of HTTP/2 (RFC 9113) and gRPC over it (``PROTOCOL-HTTP2.md``):

- frames: every type a client sends is read; ``PRIORITY`` and unknown types are ignored, as the
  RFC says; padding is stripped; ``CONTINUATION`` joins a header block (bounded); headers are
  decoded with ``hpack`` (the dynamic table kept in step) and sent as literals without indexing;
- flow control both ways: what is sent waits for the peer's windows (connection and stream, the
  peer's ``INITIAL_WINDOW_SIZE`` changes applied); what is received is credited back to the
  connection on arrival and to a stream once its handler has taken it (a stream whose handler does
  not read, or whose answers the peer does not read, stops getting credit: memory stays bounded);
- gRPC: length-prefixed messages (no compression: a compressed message is ``UNIMPLEMENTED``), at
  most ``max_message_bytes`` received (``RESOURCE_EXHAUSTED`` beyond), ``grpc-timeout`` honoured
  (the handler is cancelled, ``DEADLINE_EXCEEDED``), trailers with ``grpc-status`` and a
  percent-encoded ``grpc-message``; an unknown method is ``UNIMPLEMENTED``;
- a peer's ``RST_STREAM`` (or a lost connection) cancels the stream's handler, so its ``finally``
  frees what it holds; a drain sends ``GOAWAY``, refuses new streams, and gives the streams in
  flight until a deadline.

A protocol error ends the connection with ``GOAWAY`` and the error's code.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from typing import Awaitable, Callable, cast

import hpack

log = logging.getLogger("modelplex.router.picker")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Settings (§6.5.2) and error codes (§7).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7))
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 6, 7, 9
# gRPC status codes.
OK, CANCELLED, DEADLINE_EXCEEDED, NOT_FOUND, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 1, 4, 5, 8, 12, 13

DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
#: Ours: a stream may have this much unread before its credit stops; the connection's window is
#: raised to :data:`CONNECTION_WINDOW` at once and credited back as data arrives.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
#: Credit is sent back in steps of at least this much (small exchanges never need any).
CREDIT_STEP = STREAM_WINDOW // 4
MAX_STREAMS = 4096
MAX_HEADER_BLOCK = 64 << 10
FRAME_LIMIT = 16_384  # ours, the protocol's default: we announce no other

_TIMEOUT = re.compile(r"^(\d{1,8})([HMSmun])$")
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class GrpcError(Exception):
    """End the call with ``status`` and ``message`` (the handler's way to refuse)."""

    def __init__(self, status: int, message: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message


class _ConnectionError(Exception):
    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


#: A method: ``await handler(call)`` reads the call's messages and sends its answers.
Handler = Callable[["Call"], Awaitable[None]]


class Call:
    """One gRPC call: its request headers, the messages received (``async for``: raw bytes, each
    the serialised message), and :meth:`send` for the answers."""

    __slots__ = ("stream_id", "headers", "_connection", "_messages", "_waiter", "_ended", "_queued",
                 "_credit", "_assembling", "_pending", "_send_window", "_task", "_remote_closed", "_done", "_timer",
                 "_closing")

    def __init__(self, connection: _Connection, stream_id: int, headers: dict[str, str], send_window: int):
        self.stream_id = stream_id
        self.headers = headers
        self._connection = connection
        self._messages: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False  # the peer sent END_STREAM
        self._queued = 0  # bytes of whole messages not yet read by the handler
        self._credit = 0  # bytes received and not yet credited back to the stream
        self._assembling = bytearray()
        self._pending: collections.deque[bytes] = collections.deque()  # framed, waiting for window
        self._send_window = send_window
        self._task: asyncio.Task[None] | None = None
        self._remote_closed = False
        self._done = False
        self._timer: asyncio.TimerHandle | None = None
        self._closing: tuple[bytes, bool] | None = None  # the trailers, once the answers are out

    def __aiter__(self) -> Call:
        return self

    async def __anext__(self) -> bytes:
        while not self._messages:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self._messages.popleft()
        self._queued -= len(message) + 5
        self._connection.credit(self)
        return message

    def send(self, message: bytes) -> None:
        """Send one serialised message (queued for the peer's window when it is short)."""
        if self._done:
            return
        self._pending.append(len(message).to_bytes(5, "big") + message)
        self._connection.flush_stream(self)

    # -- what the connection tells the call ------------------------------------------------------

    def _received(self, data: bytes, limit: int) -> None:
        buffer = self._assembling
        buffer += data
        while len(buffer) >= 5:
            if buffer[0]:
                raise GrpcError(UNIMPLEMENTED, "compressed messages are not supported")
            size = int.from_bytes(buffer[1:5], "big")
            if size > limit:
                raise GrpcError(RESOURCE_EXHAUSTED, f"a message of {size} bytes is over the limit of {limit}")
            if len(buffer) < 5 + size:
                break
            self._messages.append(bytes(buffer[5:5 + size]))
            self._queued += 5 + size
            del buffer[:5 + size]
        self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Connection(asyncio.Protocol):
    def __init__(self, server: Http2GrpcServer):
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface = False
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK)
        self.calls: dict[int, Call] = {}
        self.last_stream = 0
        self.header_block: tuple[int, int, bytearray] | None = None
        self.peer_window = DEFAULT_WINDOW  # the connection's send window
        self.peer_initial = DEFAULT_WINDOW
        self.peer_frame = FRAME_LIMIT
        self.received = 0  # bytes of DATA not yet credited to the connection
        self.out: list[bytes] = []
        self.flushing = False
        self.blocked: dict[Call, None] = {}  # calls waiting for the connection's window, in order
        self.going_away = False
        self.closed = False

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass, but is one
        self.server.connections.add(self)
        settings = b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in (
            (ENABLE_PUSH, 0), (MAX_CONCURRENT_STREAMS, MAX_STREAMS), (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK)))
        self._frame(SETTINGS, 0, 0, settings)
        self._frame(WINDOW_UPDATE, 0, 0, (CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big"))

    def connection_lost(self, error: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for call in list(self.calls.values()):
            self._cancel(call)

    def pause_writing(self) -> None:  # the peer does not read: neither do we, until it does
        assert self.transport is not None
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        assert self.transport is not None
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        try:
            if not self.preface:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buffer)):
                        raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buffer[:len(PREFACE)] != PREFACE:
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                del buffer[:len(PREFACE)]
                self.preface = True
            at = 0
            while len(buffer) - at >= 9:
                length = int.from_bytes(buffer[at:at + 3], "big")
                if length > FRAME_LIMIT:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if len(buffer) - at < 9 + length:
                    break
                kind, flags = buffer[at + 3], buffer[at + 4]
                stream_id = int.from_bytes(buffer[at + 5:at + 9], "big") & 0x7FFF_FFFF
                payload = bytes(buffer[at + 9:at + 9 + length])
                at += 9 + length
                self._on_frame(kind, flags, stream_id, payload)
            del buffer[:at]
        except _ConnectionError as error:
            self._fail(error.code, str(error))
        except Exception:  # noqa: BLE001 - a bug here ends this connection, said why, not the router
            log.exception("the picker's HTTP/2 connection failed")
            self._fail(INTERNAL_ERROR, "internal error")
        self._flush()

    # -- frames in ------------------------------------------------------------------------------

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.header_block is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            if stream_id == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
            payload = _unpadded(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._on_headers(stream_id, flags, payload)
            else:
                self.header_block = (stream_id, flags, bytearray(payload))
        elif kind == CONTINUATION:
            if self.header_block is None or self.header_block[0] != stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            block = self.header_block[2]
            block += payload
            if len(block) > MAX_HEADER_BLOCK:
                raise _ConnectionError(PROTOCOL_ERROR, "a header block over the limit")
            if flags & END_HEADERS:
                first_flags = self.header_block[1]  # END_STREAM rides on the HEADERS frame
                self.header_block = None
                self._on_headers(stream_id, first_flags, bytes(block))
        elif kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
                self._frame(SETTINGS, ACK, 0)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a PING of other than 8 bytes")
            if not flags & ACK:
                self._frame(PING, ACK, 0, payload)
        elif kind == RST_STREAM:
            call = self.calls.get(stream_id)
            if call is not None:
                self._cancel(call)
        elif kind == GOAWAY:
            self.going_away = True
            if not self.calls:
                self._close()
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown types are ignored (RFC 9113 §5.5).

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        self.received += len(payload)
        if self.received >= CREDIT_STEP:
            self._frame(WINDOW_UPDATE, 0, 0, self.received.to_bytes(4, "big"))
            self.received = 0
        call = self.calls.get(stream_id)
        if call is None or call._remote_closed or call._done:
            return  # a stream already over (ours ended it, or it was reset): its data is dropped
        data = _unpadded(flags, payload)
        call._credit += len(payload)
        try:
            if call._credit > STREAM_WINDOW:  # more than the window it was given
                raise GrpcError(RESOURCE_EXHAUSTED, "the stream's flow-control window was overrun")
            call._received(data, self.server.max_message_bytes)
        except GrpcError as error:
            self._finish(call, error.status, error.message, reset=True)
            return
        if flags & END_STREAM:
            call._remote_closed = True
            call._end()
        self.credit(call)

    def _on_headers(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            # Bytes, read as latin-1: a value that is not UTF-8 is a value, not a broken connection.
            headers = {name.decode("latin-1"): value.decode("latin-1")
                       for name, value in cast(list[tuple[bytes, bytes]], self.decoder.decode(block, raw=True))}
        except hpack.HPACKError as error:
            raise _ConnectionError(COMPRESSION_ERROR, f"a header block that does not decode: {error}") from None
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client: the end of its side
            call._remote_closed = True
            call._end()
            return
        if stream_id % 2 == 0:
            raise _ConnectionError(PROTOCOL_ERROR, f"a client opened stream {stream_id}, an even one")
        if stream_id <= self.last_stream:
            return  # a stream already over (a client's late trailers): decoded above, for the table
        self.last_stream = stream_id
        if self.going_away or self.server.draining or len(self.calls) >= MAX_STREAMS:
            self._frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big"))
            return
        call = Call(self, stream_id, headers, self.peer_initial)
        self.calls[stream_id] = call
        if flags & END_STREAM:
            call._remote_closed = True
            call._end()
        handler = self.server.methods.get(headers.get(":path", ""))
        if headers.get(":method") != "POST" or not headers.get("content-type", "").startswith("application/grpc"):
            self._finish(call, UNIMPLEMENTED, "not a gRPC request", reset=not call._remote_closed)
            return
        if handler is None:
            self._finish(call, UNIMPLEMENTED, f"unknown method {headers.get(':path', '')}",
                         reset=not call._remote_closed)
            return
        self._frame(HEADERS, END_HEADERS, stream_id, _RESPONSE_HEADERS)
        call._task = self.loop.create_task(self._run(call, handler))
        if (timeout := _timeout_s(headers.get("grpc-timeout"))) is not None:
            call._timer = self.loop.call_later(timeout, self._expire, call)

    def _on_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for at in range(0, len(payload), 6):
            key, value = int.from_bytes(payload[at:at + 2], "big"), int.from_bytes(payload[at + 2:at + 6], "big")
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta, self.peer_initial = value - self.peer_initial, value
                for call in self.calls.values():
                    call._send_window += delta
                if delta > 0:
                    self._unblock(list(self.calls.values()))
            elif key == MAX_FRAME_SIZE:
                if not FRAME_LIMIT <= value <= 16_777_215:
                    raise _ConnectionError(PROTOCOL_ERROR, "a max frame size out of range")
                self.peer_frame = value
            # HEADER_TABLE_SIZE: our answers use no dynamic table; the others bound the peer's own.

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of other than 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFF_FFFF
        if stream_id == 0:
            self.peer_window += increment
            if self.peer_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
            blocked, self.blocked = list(self.blocked), {}
            self._unblock(blocked)
        elif (call := self.calls.get(stream_id)) is not None:
            call._send_window += increment
            self._unblock([call])

    # -- frames out -----------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        self.out.append(len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big")
                        + payload)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        if self.out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def flush_stream(self, call: Call) -> None:
        """Send what ``call`` has pending, as far as both windows allow."""
        pending = call._pending
        while pending:
            chunk = pending[0]
            room = min(call._send_window, self.peer_window, self.peer_frame)
            if room <= 0:
                if call._send_window > 0:  # the connection's window is spent, not the stream's
                    self.blocked[call] = None
                return
            if len(chunk) > room:
                pending[0] = chunk[room:]
                chunk = chunk[:room]
            else:
                pending.popleft()
            call._send_window -= len(chunk)
            self.peer_window -= len(chunk)
            self._frame(DATA, 0, call.stream_id, chunk)
        if call._closing is not None:
            self._send_trailers(call)

    def _unblock(self, calls: list[Call]) -> None:
        for call in calls:
            if call._pending and call.stream_id in self.calls:
                self.flush_stream(call)
                self.credit(call)

    def credit(self, call: Call) -> None:
        """Give ``call``'s stream back what it received, unless its handler has not read it or
        the peer has not read its answers (then that stream waits; the connection does not)."""
        if (call._credit >= CREDIT_STEP and not call._remote_closed
                and call._queued + sum(map(len, call._pending)) < STREAM_WINDOW):
            self._frame(WINDOW_UPDATE, 0, call.stream_id, call._credit.to_bytes(4, "big"))
            call._credit = 0

    # -- calls ------------------------------------------------------------------------------------

    async def _run(self, call: Call, handler: Handler) -> None:
        status, message = OK, ""
        try:
            await handler(call)
        except GrpcError as error:
            status, message = error.status, error.message
        except asyncio.CancelledError:
            # Reset by the peer, the connection lost, the deadline: ended already. Else (the loop
            # closing) the peer hears it.
            self._finish(call, CANCELLED, "cancelled", reset=not call._remote_closed)
            raise
        except Exception:  # noqa: BLE001 - one call's fault ends that call
            log.exception("the gRPC method %s failed", call.headers.get(":path"))
            status, message = INTERNAL, "internal error; see the router log"
        self._finish(call, status, message, reset=not call._remote_closed)

    def _finish(self, call: Call, status: int, message: str, *, reset: bool) -> None:
        """End ``call`` with ``status``: its trailers follow its answers (an error drops the ones
        still waiting for window), then, where the peer's side is still open, ``RST_STREAM`` so
        the peer sends no more."""
        if call._done:
            return
        call._done = True
        if call._timer is not None:
            call._timer.cancel()
        if status != OK:
            call._pending.clear()
        call._closing = (_trailers(status, message, with_status_line=call._task is None), reset)
        if not call._pending:
            self._send_trailers(call)
        if call._task is not None and not call._task.done() and call._task is not asyncio.current_task():
            call._task.cancel()

    def _send_trailers(self, call: Call) -> None:
        assert call._closing is not None
        trailers, reset = call._closing
        call._closing = None
        self._frame(HEADERS, END_HEADERS | END_STREAM, call.stream_id, trailers)
        if reset:
            self._frame(RST_STREAM, 0, call.stream_id, NO_ERROR.to_bytes(4, "big"))
        self._forget(call)

    def _cancel(self, call: Call) -> None:
        """The peer reset ``call`` (or went away): its handler is cancelled, nothing more is sent."""
        call._done = True
        if call._timer is not None:
            call._timer.cancel()
        self._forget(call)
        if call._task is not None and not call._task.done():
            call._task.cancel()

    def _expire(self, call: Call) -> None:
        self._finish(call, DEADLINE_EXCEEDED, "deadline exceeded", reset=not call._remote_closed)

    def _forget(self, call: Call) -> None:
        self.calls.pop(call.stream_id, None)
        self.blocked.pop(call, None)
        if not self.calls and (self.going_away or self.server.draining):
            self._close()

    # -- the connection's end -------------------------------------------------------------------

    def go_away(self) -> None:
        """Take no new streams; close once the ones in flight are over."""
        if not self.closed and not self.going_away:
            self.going_away = True
            self._frame(GOAWAY, 0, 0, self.last_stream.to_bytes(4, "big") + NO_ERROR.to_bytes(4, "big"))
            if not self.calls:
                self._close()

    def abort(self) -> None:
        for call in list(self.calls.values()):
            self._cancel(call)
        self._close()

    def _fail(self, code: int, why: str) -> None:
        log.warning("closing an HTTP/2 connection to the picker: %s", why)
        self._frame(GOAWAY, 0, 0, self.last_stream.to_bytes(4, "big") + code.to_bytes(4, "big") + why.encode()[:200])
        self.abort()

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.closed = True
            self.transport.close()


class Http2GrpcServer:
    """gRPC methods (``{"/package.Service/Method": handler}``) on ``host:port``, on the running
    event loop, each message received at most ``max_message_bytes``; :attr:`port` is the one
    bound (0 asks for a free one)."""

    def __init__(self, methods: dict[str, Handler], *, max_message_bytes: int = 4 << 20):
        self.methods = methods
        self.max_message_bytes = max_message_bytes
        self.connections: set[_Connection] = set()
        self.draining = False
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        """Bind (no ``SO_REUSEPORT``: a port in use is an ``OSError``) and serve."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_port=False)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        """Stop listening; ``GOAWAY`` to every connection; the calls in flight get ``grace_s``."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        deadline = asyncio.get_running_loop().time() + grace_s
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await asyncio.sleep(0)  # the cancelled handlers run their cleanup


def _unpadded(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "padding longer than its frame")
    return payload[1:len(payload) - payload[0]]


def _timeout_s(value: str | None) -> float | None:
    if not value or not (match := _TIMEOUT.match(value)):
        return None
    return int(match[1]) * _TIMEOUT_UNITS[match[2]]


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer (RFC 7541 §5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing (RFC 7541 §6.2.2; our answers leave the
    peer's decoding table alone), no Huffman coding."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


def _percent_encoded(message: str) -> bytes:
    return "".join(c if " " <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode())
                   for c in message).encode("ascii")


_STATUS_200 = b"\x88"  # the static table's ":status: 200"
_RESPONSE_HEADERS = _STATUS_200 + _literal(b"content-type", b"application/grpc")


def _trailers(status: int, message: str, *, with_status_line: bool) -> bytes:
    """The call's last header block (a trailers-only answer carries ``:status`` too)."""
    block = _RESPONSE_HEADERS if with_status_line else b""
    block += _literal(b"grpc-status", str(status).encode())
    if message:
        block += _literal(b"grpc-message", _percent_encoded(message))
    return block


__all__ = ["Call", "GrpcError", "Handler", "Http2GrpcServer"]
