"""The router's HTTP/1.1 client to its replicas: keep-alive connections, one request at a time on
each, answers parsed by ``httptools`` (llhttp, the parser Node.js uses).

Every proxied request crosses this hop, and aiohttp's general client (cookies, redirects,
tracing, middlewares, a request object built per call) cost the router about a fifth of its CPU
per request under the batched load (``bench/results/small-machine-2026-11-28``). This client does
what the proxy needs and nothing else:

- a request is written in one ``writelines`` (head and body), with the process's internal
  credential, and sent once more with the upgrade's fallback credential where the first is
  refused (401), as :func:`modelplex.http.sending_token` does for the aiohttp sessions;
- an answer's body is read as its sender framed it: each HTTP chunk whole (a chunk larger than
  :data:`PIECE_BYTES` in pieces), never two merged, so a stream relays one chunk per item;
- reading pauses while more than :data:`PAUSE_BYTES` of an answer wait unread (a slow client
  holds back the replica, not the router's memory);
- a connection idle for ``idle_timeout_s`` is closed, one the replica closed is dropped, one whose
  answer was not read to its end is never reused;
- failures raise aiohttp's exception types (:class:`aiohttp.ClientConnectionError` before or
  during an answer, :class:`aiohttp.ClientPayloadError` for a malformed or cut body), which the
  proxy's retry rules already read.
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from typing import Callable, Mapping

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from modelplex.http import upstream_chunks
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, DeploymentCredential, TokenFile

#: An answer's unread bytes past which the connection stops reading (and resumes below half).
PAUSE_BYTES = 1 << 20
#: A chunk larger than this is handed over in pieces as it arrives.
PIECE_BYTES = 256 << 10
_CRLF = "\r\n"
#: A connection's destination: (TLS, host, port).
_Key = tuple[bool, str, int]
#: What no request line or header may hold (aiohttp's rule: control characters but tab).
_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: Fields this client writes itself (the body's framing).
_OWN_FIELDS = frozenset({"content-length", "transfer-encoding"})


class UpstreamDisconnected(aiohttp.ServerDisconnectedError):
    """The replica closed the connection before its answer was complete."""


class UpstreamRefused(aiohttp.ClientConnectionError):
    """No connection to the replica could be opened (refused, unreachable, timed out)."""


class UpstreamBodyError(aiohttp.ClientPayloadError):
    """The answer's body broke off or could not be parsed."""


class Body:
    """An answer's body as it arrives: :meth:`readchunk` gives ``(data, end_of_http_chunk)``
    the way :class:`aiohttp.StreamReader` does (``(b"", False)`` at the end)."""

    def __init__(self, connection: _Connection):
        self._connection = connection
        self._chunks: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    async def readchunk(self) -> tuple[bytes, bool]:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b"", False
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data, end = self._chunks.popleft()
        self._size -= len(data)
        if self._size < PAUSE_BYTES // 2:
            self._connection.resume()
        return data, end

    async def read(self) -> bytes:
        return b"".join([data async for data in upstream_chunks(self)])

    # -- fed by the connection ---------------------------------------------------------------

    def _feed(self, data: bytes, end: bool) -> None:
        self._chunks.append((data, end))
        self._size += len(data)
        if self._size > PAUSE_BYTES:
            self._connection.pause()
        self._wake()

    def _end(self, error: BaseException | None = None) -> None:
        if error is None:
            self._eof = True
        elif not self._eof:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class UpstreamResponse:
    """A replica's answer: its status line and headers, and :attr:`content` as it arrives.
    :meth:`release` hands a connection read to its end back; :meth:`close` drops it."""

    __slots__ = ("status", "reason", "headers", "content", "_connection")

    def __init__(self, connection: _Connection, status: int, reason: str, headers: CIMultiDict[str]):
        self._connection = connection
        self.status = status
        self.reason = reason
        self.headers = CIMultiDictProxy(headers)
        self.content = connection.body

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def content_type(self) -> str:
        """The media type, lower case, without parameters ("application/octet-stream" when none,
        as aiohttp says)."""
        value = self.headers.get("Content-Type")
        if not value:
            return "application/octet-stream"
        return value.split(";", 1)[0].strip().lower()

    async def read(self) -> bytes:
        return await self.content.read()

    def release(self) -> None:
        self._connection.done()

    def close(self) -> None:
        self._connection.close()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica: one request at a time."""

    # The current answer's, reset by start().
    _headers: CIMultiDict[str]
    _piece: list[bytes]

    def __init__(self, pool: UpstreamPool, key: _Key):
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._paused = False
        self.start()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamBodyError("the replica answered with a protocol upgrade"))
        except httptools.HttpParserError as error:
            self._fail(UpstreamBodyError(f"malformed answer from the replica: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self.pool._forget(self)
        if exc is None and self._head is not None and self._head.done() and not self._chunked \
                and "Content-Length" not in self._headers:
            self.body._end()  # a body without length or chunks ends with its connection
            return
        self._fail(UpstreamDisconnected(f"the replica closed the connection{f' ({exc})' if exc else ''}"))

    # -- httptools callbacks ------------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.add(name.decode("latin-1"), value.decode("latin-1"))  # httptools joins split pieces

    def on_headers_complete(self) -> None:
        response = UpstreamResponse(self, self.parser.get_status_code(), self._reason.decode("latin-1"), self._headers)
        self._chunked = "chunked" in self._headers.get("Transfer-Encoding", "").lower()
        if self._head is not None and not self._head.done():
            self._head.set_result(response)

    def on_chunk_header(self) -> None:
        self._piece, self._piece_size = [], 0

    def on_body(self, body: bytes) -> None:
        if not self._chunked:
            self.body._feed(body, False)
            return
        self._piece.append(body)
        self._piece_size += len(body)
        if self._piece_size >= PIECE_BYTES:
            self.body._feed(b"".join(self._piece), False)
            self._piece, self._piece_size = [], 0

    def on_chunk_complete(self) -> None:
        if self._piece:
            self.body._feed(b"".join(self._piece), True)
        self._piece, self._piece_size = [], 0

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        self.body._end()

    # -- used by the pool and the response ----------------------------------------------------

    async def send(self, head: bytes, body: bytes) -> UpstreamResponse:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._head = loop.create_future()
        self.transport.writelines((head, body) if body else (head,))
        return await self._head

    def start(self) -> None:
        """Ready for the next request's answer."""
        self.parser = httptools.HttpResponseParser(self)
        self.body = Body(self)
        self._headers = CIMultiDict()
        self._reason = b""
        self._piece = []
        self._piece_size = 0
        self._chunked = False
        self.reusable = False  # the answer ended cleanly and the replica keeps the connection

    def done(self) -> None:
        """The answer was used: back to the pool if it was read to its end, else closed."""
        self.resume()
        if self.reusable and self.body.at_eof() and self.transport is not None and not self.transport.is_closing():
            self.idle_since = self.pool.clock()
            self.pool._idle(self)
        else:
            self.close()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _fail(self, error: BaseException) -> None:
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self.body._end(error)
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections to the replicas, opened as needed (no cap: each replica's
    ``maxOngoingRequests`` bounds how many are busy), kept ``idle_timeout_s`` when idle.

    ``credential``: this process's internal credential, sent with every request (None: none)."""

    def __init__(self, *, connect_timeout_s: float | None, idle_timeout_s: float = 30.0,
                 credential: TokenFile | None = None, clock: Callable[[], float] = time.monotonic):
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._token = credential.token if credential is not None else None
        self._fallback = credential.own if isinstance(credential, DeploymentCredential) else None
        self.clock = clock
        self._idle_by_key: dict[_Key, list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._closed = False

    async def request(self, method: str, url: URL, *, data: bytes = b"",
                      headers: Mapping[str, str] | None = None) -> UpstreamResponse:
        """Send one request; its answer once the status line and headers are in (the body follows
        in ``content``). Raises :class:`aiohttp.ClientConnectionError` when it could not be sent or
        the replica closed the connection before answering."""
        fields = dict(headers or {})
        token = self._token() if self._token is not None else None
        if token is not None:
            fields[INTERNAL_TOKEN_HEADER] = token
        response = await self._once(method, url, data, fields)
        other = self._fallback() if self._fallback is not None and response.status == 401 else None
        if other is None or other == token:
            return response
        await response.read()
        response.release()
        fields[INTERNAL_TOKEN_HEADER] = other
        return await self._once(method, url, data, fields)

    async def close(self) -> None:
        """Close every connection (the busy ones too)."""
        self._closed = True
        for connection in list(self._all):
            connection.close()
        self._idle_by_key.clear()

    # -- one request on one connection --------------------------------------------------------

    async def _once(self, method: str, url: URL, body: bytes, fields: Mapping[str, str]) -> UpstreamResponse:
        host, port = url.raw_host or "", url.port or (443 if url.scheme == "https" else 80)
        connection = await self._connection((url.scheme == "https", host, port))
        connection.start()
        head = _head(method, url.raw_path_qs, f"{host}:{port}", body, fields)
        try:
            return await connection.send(head, body)
        except BaseException:
            connection.close()
            raise

    async def _connection(self, key: _Key) -> _Connection:
        tls, host, port = key
        idle = self._idle_by_key.get(key)
        now = self.clock()
        while idle:
            connection = idle.pop()  # the most recent: the least likely to have been closed
            if now - connection.idle_since < self.idle_timeout_s and connection.transport is not None \
                    and not connection.transport.is_closing():
                return connection
            connection.close()
        if self._closed:
            raise UpstreamRefused("the router is stopping")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(lambda: _Connection(self, key), host, port,
                                                             ssl=True if tls else None)
        except TimeoutError:
            raise UpstreamRefused(f"no connection to {host}:{port} within {self.connect_timeout_s:g} s") from None
        except OSError as error:  # ssl.SSLError among them
            raise UpstreamRefused(f"cannot connect to {host}:{port}: {error.strerror or error}") from None
        self._all.add(connection)
        return connection

    def _idle(self, connection: _Connection) -> None:
        if self._closed:
            connection.close()
            return
        self._idle_by_key.setdefault(connection.key, []).append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._all.discard(connection)
        idle = self._idle_by_key.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)


def _head(method: str, target: str, host: str, body: bytes, fields: Mapping[str, str]) -> bytes:
    """The request line and headers: ``fields`` (a ``Host`` among them replaces the replica's
    address, as with aiohttp), the body's length. A control character in a field (a CR or LF
    would split the request) is refused, as aiohttp does. Text goes out as UTF-8, and bytes a
    client sent that were not UTF-8 (kept by aiohttp's server as surrogate escapes) as they came."""
    lines = [f"{method} {target} HTTP/1.1"]
    has_host = False
    for name, value in fields.items():
        if _FORBIDDEN.search(name) or _FORBIDDEN.search(value) or ":" in name:
            raise ValueError(f"a control character or colon in the request header {name!r}")
        lower = name.lower()
        if lower in _OWN_FIELDS:
            continue
        has_host = has_host or lower == "host"
        lines.append(f"{name}: {value}")
    if not has_host:
        lines.append(f"Host: {host}")
    lines.append(f"Content-Length: {len(body)}")
    return (_CRLF.join(lines) + _CRLF + _CRLF).encode("utf-8", "surrogateescape")
