"""The streaming proxy: one request to one replica, retried elsewhere while that is still safe.

A request is retried on another replica only before the first replica sent a status line: a
replica that fails before it (connection refused, dropped with the request) may never have
seen the request, one that sent a status line took it and may have run the handler, whatever
happens after. A failed request goes to another replica, never the same one twice, and is sent
at most twice in all (:attr:`Proxy.max_failures`). A replica's 503 (full, not ready) is a
refusal, not an answer: it ran nothing, and the request is offered again, to the replicas that
refused it too once no other is left, after a wait that doubles with each refusal (50 ms up to
1 s), until the request's queue bound.

The client's response is committed when the replica's first body chunk arrives (or its empty
body ends); after that, chunks are relayed as they come, one ``write()`` per HTTP chunk the replica sent (never two merged: a stream reaches the client one chunk per item), with no
per-chunk parsing; the replica's status, content type and encoding pass through (the body goes
on as sent, never decompressed). A write whose data does not drain within ``streamIdleTimeoutSeconds`` (the
client stopped reading) cuts the stream: 499, and the replica's slot is freed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Mapping, TypeVar

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict
from yarl import URL

from modelplex.http import HOP_BY_HOP, StreamIdle, first_chunk, upstream_chunks, write_chunk
from modelplex.wire.errors import ReplicaFailed, UpstreamTimeout
from modelplex.wire.names import LOADED_MODELS_HEADER, MODEL_ID_HEADER
from modelplex.wire.spec import DEFAULT_STREAM_IDLE_TIMEOUT_S
from modelplex.wire.streams import sse_error_frame
from modelplex_router.endpoints import INVOKE_PATH
from modelplex_router.events import Answered, ConnectionFailed, SummaryHeard
from modelplex_router.metrics import RouterMetrics
from modelplex_router.record import Replica
from modelplex_router.scheduler import Lease, Scheduler
from modelplex_router.upstream import UpstreamPool, UpstreamResponse

log = logging.getLogger("modelplex.router.proxy")

#: Request headers the replica may use; the rest (cookies, auth, hop-by-hop) stay here.
#: Not Content-Encoding: aiohttp has already decoded the body (within client_max_size).
FORWARDED_REQUEST_HEADERS = (
    hdrs.CONTENT_TYPE,
    hdrs.ACCEPT,
    hdrs.ACCEPT_ENCODING,
    "X-Request-Id",
    "traceparent",
    "tracestate",
)
#: Replica response headers the client never sees: those of one hop, those aiohttp sets itself
#: (length, date, server), and the loaded-models summary, which is for this router.
NOT_RELAYED = HOP_BY_HOP | {h.lower() for h in (hdrs.CONTENT_LENGTH, hdrs.DATE, hdrs.SERVER, LOADED_MODELS_HEADER)}
REPLICA_HEADER = "X-Modelplex-Replica"
#: Set on a response cut short after it was committed: the status to count it as.
ABORTED = "modelplex_aborted"

T = TypeVar("T")

#: Connection-level failures: the replica may not have seen the request or died with it.
_FAILURES = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


class _Retry(Exception):
    """This replica cannot answer; another may (nothing reached the client yet)."""

    def __init__(self, reason: str, *, failed: bool):
        super().__init__(reason)
        self.reason = reason
        self.failed = failed  # a connection failure (limited retries), not a refusal


class Proxy:
    """Sends requests through ``scheduler`` over the connections of ``upstream``; tells the
    scheduler's table what the replicas' answers show (alive, failed, their loaded-models summary)."""

    #: Failures before a status line tolerated per request: sent at most twice in all, each time
    #: to another replica (a failed one leaves rotation, and the request excludes it).
    max_failures = 1

    def __init__(self, scheduler: Scheduler, upstream: UpstreamPool, metrics: RouterMetrics,
                 *, first_byte_timeout_s: float, clock: Callable[[], float],
                 stream_idle_timeout_s: float = DEFAULT_STREAM_IDLE_TIMEOUT_S):
        self.scheduler = scheduler
        self.table = scheduler.table
        self.upstream = upstream
        self.metrics = metrics
        self.first_byte_timeout_s = first_byte_timeout_s
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.clock = clock
        self._urls: dict[str, URL] = {}

    async def forward(self, request: web.Request, model: str, body: bytes, *, method: str = "POST",
                      path: str = INVOKE_PATH, headers: Mapping[str, str] | None = None,
                      buffer: bool = False) -> web.StreamResponse:
        """Answer ``request`` (already read into ``body``) from a replica, for ``model``.

        ``method`` and ``path`` name the replica endpoint (its ``/v1/invoke`` by default),
        ``headers`` are added to the forwarded ones, and ``buffer`` reads the whole answer into
        a ``web.Response`` (for unary protocols whose error bodies the caller rewrites).
        """
        forwarded = {name: value for name in FORWARDED_REQUEST_HEADERS if (value := request.headers.get(name))}
        if model:
            forwarded[MODEL_ID_HEADER] = model
        forwarded.update(headers or {})
        target = _Target(method, path, buffer)
        return await self._place(model, forwarded, lambda lease, sent: self._attempt(request, lease, target, sent, body))

    async def exchange(self, model: str, body: bytes, headers: Mapping[str, str],
                       consume: Callable[[Reply], Awaitable[T]], *, method: str = "POST", path: str = INVOKE_PATH,
                       buffer: bool = True) -> T:
        """:meth:`forward` for callers that are not aiohttp handlers (the gRPC service): the same
        queue, retries and bounds; ``consume`` gets the replica's :class:`Reply` (its whole body
        in ``first`` when ``buffer``, else the chunks as they come) while the replica's slot is
        held, and what it returns is the answer."""
        sent = {MODEL_ID_HEADER: model} if model else {}
        sent.update(headers)
        target = _Target(method, path, buffer)
        return await self._place(model, sent,
                                 lambda lease, sent: self._consume(lease, target, sent, body, consume))

    async def _place(self, model: str, headers: dict[str, str],
                     attempt: Callable[[Lease, dict[str, str]], Awaitable[T]]) -> T:
        """``attempt`` on the replicas the scheduler gives, until one answers: a refusal waits and
        tries again (within the request's queue bound), a failure tries another replica once."""
        failures = 0
        refusals = 0
        exclude: set[str] = set()
        since = self.clock()  # one bound on waiting for the whole request, retries included
        while True:
            lease = await self.scheduler.acquire(model, exclude, since=since, refusals=refusals)
            if not failures and not refusals:
                self.metrics.waited(model, self.clock() - since)  # the first slot: its time in the queue
            self.metrics.routed(lease.kind, model)
            try:
                return await attempt(lease, headers)
            except _Retry as retry:
                exclude.add(lease.replica.name)
                if retry.failed:
                    failures += 1
                    if failures > self.max_failures:
                        raise ReplicaFailed(
                            f"replica {lease.replica.name} failed ({retry.reason}) and so did the retry"
                        ) from None
                else:
                    refusals += 1  # tried again after a growing wait, within the request's bound
                self.metrics.retried("replica_failed" if retry.failed else "replica_full")
                log.debug("retrying a request for %r elsewhere: %s %s", model, lease.replica.name, retry.reason)

    async def _consume(self, lease: Lease, target: _Target, headers: dict, body: bytes,
                       consume: Callable[[Reply], Awaitable[T]]) -> T:
        """One try of :meth:`exchange` on the lease's replica."""
        ok = False
        clean = False
        upstream: UpstreamResponse | None = None
        try:
            upstream, first = await self._send(lease, target, headers, body)
            self._heard(lease, upstream)
            clean = target.buffer  # read whole: the connection is reusable whatever ``consume`` makes of it
            rest = _no_chunks() if target.buffer else upstream_chunks(upstream.content)
            try:
                result = await consume(Reply(upstream.status, upstream.headers, first, rest, lease.replica.name))
            except _FAILURES as error:  # the replica died mid-stream: the caller's answer is cut
                raise ReplicaFailed(f"replica {lease.replica.name} failed mid-stream ({type(error).__name__})") from None
            clean = clean or upstream.content.at_eof()
            ok = upstream.status < 400
            return result
        finally:
            _done(upstream, lease, clean=clean, ok=ok)

    async def _attempt(self, request: web.Request, lease: Lease, target: _Target, headers: dict,
                       body: bytes) -> web.StreamResponse:
        """One try on the lease's replica: send, then answer the client from what it sends."""
        ok = False  # the replica answered successfully: it holds the model
        clean = False  # the replica's response was read to its end: the connection is reusable
        upstream: UpstreamResponse | None = None
        try:
            upstream, first = await self._send(lease, target, headers, body)
            self._heard(lease, upstream)
            # Commit: from here on the client has the status line.
            answer_headers = _answer_headers(upstream, lease.replica.name)
            if target.buffer or _whole(upstream, first):
                # The whole (unary) answer came in one read: send headers and body in one write.
                clean, ok = True, upstream.status < 400
                return web.Response(status=upstream.status, reason=upstream.reason, body=first,
                                    headers=answer_headers)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=answer_headers)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            clean = await self._relay(request, lease, upstream, first, response)
            ok = clean and upstream.status < 400
            if clean:
                await _end(response)
            return response
        finally:
            _done(upstream, lease, clean=clean, ok=ok)

    def _heard(self, lease: Lease, upstream: UpstreamResponse) -> None:
        """Take in the loaded-models summary a replica's answer carries."""
        if summary := upstream.headers.get(LOADED_MODELS_HEADER):
            # A newer version than the table's document makes it fetch the replica's document.
            self.table.apply(SummaryHeard(lease.replica, summary), self.clock())

    async def _send(self, lease: Lease, target: _Target, headers: dict,
                    body: bytes) -> tuple[UpstreamResponse, bytes]:
        """The replica's response and its first body chunk (its whole body with ``target.buffer``).
        Nothing has reached the client yet: a replica that refuses or fails raises
        :class:`_Retry`, for another one to answer."""
        replica = lease.replica
        try:
            async with asyncio.timeout(self.first_byte_timeout_s):
                return await self._first_chunk(replica, target, headers, body)
        except _FAILURES as error:
            # Refused, or dropped with the request: most likely dead. Out of rotation until
            # discovery sees it alive again, so that neither this request's retry (once
            # the replicas that refused it are allowed again) nor any other goes back to it.
            self.table.apply(ConnectionFailed(replica), self.clock())
            raise _Retry(type(error).__name__, failed=True) from None
        except TimeoutError:
            # Frozen or stuck: out of rotation until a poll finds it ready again.
            self.table.apply(ConnectionFailed(replica), self.clock())
            model = f" for model {lease.model!r}" if lease.model else ""
            raise UpstreamTimeout(f"replica {replica.name} sent nothing{model} within "
                                  f"requestTimeoutSeconds ({self.first_byte_timeout_s:g} s)") from None

    async def _first_chunk(self, replica: Replica, target: _Target, headers: dict,
                           body: bytes) -> tuple[UpstreamResponse, bytes]:
        """Send the request (the caller bounds the time); the response and its first chunk."""
        upstream = await self.upstream.request(target.method, self._url(replica.url, target.path),
                                               data=body, headers=headers)
        try:
            self.table.apply(Answered(replica), self.clock())
            if upstream.status != 503:
                try:
                    return upstream, await (upstream.read() if target.buffer else first_chunk(upstream.content))
                except _FAILURES as error:
                    # Its status line came: the replica took the request and its answer began (a
                    # handler may have run). Never sent again: the client gets one 502, not two runs.
                    self.table.apply(ConnectionFailed(replica), self.clock())
                    raise ReplicaFailed(f"replica {replica.name} failed after its answer began "
                                        f"({type(error).__name__}); not retried, it may have run the request") from None
            await upstream.read()
        except BaseException:
            upstream.close()  # unread or broken: never hand the connection back
            raise
        # Full or not ready: another replica may take it. Read to its end, the connection is reusable.
        upstream.release()
        raise _Retry("503 " + (upstream.reason or ""), failed=False)

    async def _relay(self, request: web.Request, lease: Lease, upstream: UpstreamResponse, first: bytes,
                     response: web.StreamResponse) -> bool:
        """Stream the replica's body to the client, chunks as they come. True when it was read
        to its end; False when the stream was cut (``response[ABORTED]`` says why)."""
        idle_s = self.stream_idle_timeout_s  # only a write's wait to drain counts, never the replica's silence
        try:
            await response.prepare(request)
            if first:
                await write_chunk(request, response, first, idle_s)
            async for chunk in upstream_chunks(upstream.content):
                await write_chunk(request, response, chunk, idle_s)
            return True
        except ConnectionResetError as error:
            # The client went away (or stopped reading: StreamIdle). Returning (not raising) lets
            # aiohttp close quietly; closing the replica's connection (the caller) stops the handler there.
            if isinstance(error, StreamIdle):
                log.info("cut a stream of replica %s: %s", lease.replica.name, error)
            response[ABORTED] = 499
        except _FAILURES as error:
            # The replica died mid-stream. The client must see a cut, never a clean end:
            # an event stream gets an error event first; then the connection is closed
            # before aiohttp could finish the chunked body.
            name = lease.replica.name
            log.warning("replica %s failed mid-response (%s); cutting the client's stream", name,
                        type(error).__name__)
            if upstream.content_type == "text/event-stream":
                await _send_error_event(response, ReplicaFailed(
                    f"replica {name} failed mid-stream ({type(error).__name__})"))
            if request.transport is not None:
                request.transport.close()
            response[ABORTED] = 502
        return False

    def _url(self, base: str, path: str) -> URL:
        if path != INVOKE_PATH:
            return URL(base + path)
        url = self._urls.get(base)
        if url is None:
            url = self._urls[base] = URL(base + INVOKE_PATH)
        return url


def _answer_headers(upstream: UpstreamResponse, replica: str) -> CIMultiDict[str]:
    """The client's response headers: the replica's, less those of one hop, plus which replica."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.headers.items():
        if name.lower() not in NOT_RELAYED:
            out.add(name, value)
    out[REPLICA_HEADER] = replica
    if upstream.content_type == "text/event-stream":
        # Proxies in front of us (nginx, ingress controllers) buffer and caches keep
        # answers unless told otherwise: an event stream must reach the client as sent.
        out[hdrs.CACHE_CONTROL] = "no-cache"
        out["X-Accel-Buffering"] = "no"
    return out


def _done(upstream: UpstreamResponse | None, lease: Lease, *, clean: bool, ok: bool) -> None:
    """Hand the replica's connection back (read to its end) or close it, and free the slot."""
    if upstream is not None:
        if clean:
            upstream.release()
        else:
            upstream.close()  # unread or broken: never hand the connection back
    lease.release(ok)


def _whole(upstream: UpstreamResponse, first: bytes) -> bool:
    """Whether ``first`` is the replica's whole body (its length known, and nothing follows)."""
    length = upstream.content_length
    return length is not None and len(first) == length and upstream.content.at_eof()


@dataclass(frozen=True, slots=True)
class Reply:
    """A replica's answer as :meth:`Proxy.exchange` hands it over: status, headers, the first
    chunk (the whole body when buffered) and the chunks after it."""

    status: int
    headers: Mapping[str, str]
    first: bytes
    rest: AsyncIterator[bytes]
    replica: str


async def _no_chunks() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


@dataclass(frozen=True, slots=True)
class _Target:
    """The replica endpoint a request goes to."""

    method: str
    path: str
    buffer: bool


async def _end(response: web.StreamResponse) -> None:
    try:
        await response.write_eof()
    except ConnectionResetError:
        response[ABORTED] = 499  # the client went away just before the end


async def _send_error_event(response: web.StreamResponse, error: ReplicaFailed) -> None:
    """``event: error`` with the JSON error, as the replica ends a stream whose handler failed."""
    try:
        # A blank line first ends an event the replica may have left half-sent.
        await response.write(b"\n\n" + sse_error_frame(error))
    except ConnectionResetError:
        pass

