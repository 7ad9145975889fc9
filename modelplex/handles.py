"""Handles: call another deployment through its router, as Ray Serve's DeploymentHandle does.

    detect = modelplex.handle("detect").options(multiplexed_model_id="faces-v2")
    boxes = await detect.remote(frame)                       # one result
    async for chunk in decode.options(stream=True).remote(video):   # a stream of chunks
        ...

Calls go through the deployment's router, so routing stays cache-aware and the model id
travels in the ``serve_multiplexed_model_id`` header. A handle resolves a deployment name to
its router: ``MODELPLEX_ROUTER_<NAME>`` when set (``modelplex local`` sets it for every
deployment it runs), else the deployment's Service in the pod's namespace
(``http://<name>.<POD_NAMESPACE>.svc:8000``).

Streams are pulled: a chunk is read from the socket only when the consumer asks for the next
one, so a slow consumer slows the producer (TCP backpressure) and nothing buffers without
bound. Closing the stream, or cancelling the awaiting task, closes the connection, and the
work upstream is cancelled.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator

import aiohttp

from modelplex.errors import BadRequest, ModelplexError, ReplicaFailed, UpstreamTimeout, error_for_status
from modelplex.http import encode_body, from_json, is_json
from modelplex.names import ENV_POD_NAMESPACE, MODEL_ID_HEADER, ROUTER_PORT, router_env_name

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()


def _session() -> aiohttp.ClientSession:
    # One pooled session per event loop: keep-alive connections to the routers.
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60)
        session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        _sessions[loop] = session
    return session


async def close_handles() -> None:
    """Close this event loop's pooled connections (the replica does this at shutdown)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


def resolve(deployment: str) -> str:
    """The router URL of ``deployment``: local mode's variable, else its in-cluster Service."""
    url = os.environ.get(router_env_name(deployment))
    if url:
        return url.rstrip("/")
    namespace = os.environ.get(ENV_POD_NAMESPACE)
    if namespace:
        return f"http://{deployment}.{namespace}.svc:{ROUTER_PORT}"
    raise LookupError(
        f"cannot find deployment {deployment!r}: set {router_env_name(deployment)} to its router's URL, "
        "run it with `modelplex local`, or run in a cluster (POD_NAMESPACE)"
    )


@dataclass(frozen=True)
class DeploymentHandle:
    """A reference to a deployment; :meth:`options` returns a changed copy, :meth:`remote` calls it."""

    deployment: str
    url: str
    multiplexed_model_id: str = ""
    stream: bool = False
    path: str = "/"
    timeout_s: float = 300.0

    def options(
        self,
        *,
        multiplexed_model_id: str | None = None,
        stream: bool | None = None,
        path: str | None = None,
        timeout_s: float | None = None,
    ) -> DeploymentHandle:
        changes = {
            key: value
            for key, value in (
                ("multiplexed_model_id", multiplexed_model_id),
                ("stream", stream),
                ("path", path),
                ("timeout_s", timeout_s),
            )
            if value is not None
        }
        return replace(self, **changes)

    def remote(self, body: Any = None):
        """Send ``body``; an awaitable result, or (``stream=True``) an async iterator of chunks."""
        if self.stream:
            return HandleStream(self, body)
        return self._call(body)

    def _request(self, body: Any) -> tuple[str, bytes, dict[str, str]]:
        payload, content_type = encode_body({} if body is None else body)
        headers = {"Content-Type": content_type}
        if self.multiplexed_model_id:
            headers[MODEL_ID_HEADER] = self.multiplexed_model_id
        return self.url + self.path, payload, headers

    async def _call(self, body: Any) -> Any:
        url, payload, headers = self._request(body)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with _session().post(url, data=payload, headers=headers, timeout=timeout) as response:
                data = await response.read()
                if response.status >= 400:
                    raise _error(self.deployment, response.status, data)
                if response.content_type == "application/x-ndjson":
                    raise BadRequest(f"{self.deployment} streams its answer: call it with .options(stream=True)")
                return _decode(response.content_type, data)
        except TimeoutError:
            raise UpstreamTimeout(f"{self.deployment}: no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientError as error:
            raise ReplicaFailed(f"{self.deployment}: {error}") from None


class HandleStream:
    """The chunks of one streaming call, read from the socket only as they are consumed."""

    def __init__(self, handle: DeploymentHandle, body: Any):
        self._handle = handle
        self._body = body
        self._chunks: AsyncIterator[Any] | None = None
        self._closed = False

    def __aiter__(self) -> HandleStream:
        return self

    async def __anext__(self) -> Any:
        if self._closed:
            raise StopAsyncIteration
        if self._chunks is None:
            self._chunks = self._read()
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        """Stop reading: the connection closes and the producer upstream is cancelled."""
        self._closed = True
        if self._chunks is not None:
            await self._chunks.aclose()

    async def __aenter__(self) -> HandleStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _read(self) -> AsyncIterator[Any]:
        handle = self._handle
        url, payload, headers = handle._request(self._body)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=handle.timeout_s)
        try:
            async with _session().post(url, data=payload, headers=headers, timeout=timeout) as response:
                if response.status >= 400:
                    raise _error(handle.deployment, response.status, await response.read())
                kind = response.content_type
                if kind == "application/x-ndjson":
                    async for record in _ndjson(response.content, handle.deployment):
                        yield record
                else:
                    async for data in response.content.iter_any():
                        yield data.decode() if kind.startswith("text/") else data
        except aiohttp.ClientPayloadError:
            raise ReplicaFailed(f"{handle.deployment}: the stream broke off") from None
        except TimeoutError:
            raise UpstreamTimeout(f"{handle.deployment}: no chunk within {handle.timeout_s:g} s") from None
        except aiohttp.ClientError as error:
            raise ReplicaFailed(f"{handle.deployment}: {error}") from None


#: The longest record (an NDJSON line) a stream may send; one is held at a time.
MAX_RECORD_BYTES = 64 * 1024 * 1024

_NOTHING = object()


async def _lines(content: aiohttp.StreamReader, deployment: str) -> AsyncIterator[bytes]:
    """The lines of a body as they arrive, each up to :data:`MAX_RECORD_BYTES`.

    Not ``StreamReader.readline``: it refuses lines longer than aiohttp's read buffer's
    high-water mark (512 KiB; 128 KiB in older aiohttp), which one chunk of frames passes.
    Data is read only when the consumer asks for the next line (backpressure).
    """
    buffer = bytearray()
    async for data in content.iter_any():
        searched = len(buffer)  # the held part has no newline: search only the new data
        buffer += data
        start = 0
        while (newline := buffer.find(b"\n", max(start, searched))) != -1:
            yield bytes(buffer[start:newline + 1])
            start = newline + 1
        del buffer[:start]
        if len(buffer) > MAX_RECORD_BYTES:
            raise ReplicaFailed(f"{deployment}: a streamed record passed {MAX_RECORD_BYTES} bytes")
    if buffer:
        yield bytes(buffer)


def _is_error_record(record: Any) -> bool:
    return isinstance(record, dict) and record.keys() == {"error"} and isinstance(record["error"], dict)


def _stream_error(deployment: str, record: dict) -> ModelplexError:
    error = record["error"]
    return error_for_status(500, f"{deployment}: {error.get('message')}", error.get("code"))


def _parse(line: bytes, deployment: str) -> Any:
    try:
        return from_json(line)
    except ValueError:
        raise ReplicaFailed(f"{deployment}: a streamed record is not JSON: {line[:80]!r}") from None


async def _ndjson(content: aiohttp.StreamReader, deployment: str) -> AsyncIterator[Any]:
    """The records of an NDJSON stream; a producer's failure is raised, never yielded.

    A stream that fails part way ends with an error record and a cut connection. A record of
    that shape is therefore held back until the stream goes on (then it was data after all),
    ends cleanly (data too), or is cut (the producer's error: raised with its message).
    """
    held: Any = _NOTHING
    try:
        async for line in _lines(content, deployment):
            if not line.strip():
                continue
            record = _parse(line, deployment)
            if held is not _NOTHING:
                yield held
                held = _NOTHING
            if _is_error_record(record):
                held = record
            else:
                yield record
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        if held is not _NOTHING:
            raise _stream_error(deployment, held) from None
        raise
    if held is not _NOTHING:
        yield held


def _decode(content_type: str, data: bytes) -> Any:
    if is_json(content_type):
        return from_json(data)
    if content_type.startswith("text/"):
        return data.decode()
    return data


def _error(deployment: str, status: int, data: bytes) -> ModelplexError:
    try:
        error = from_json(data)["error"]
        message, code = error["message"], error.get("code")
    except (ValueError, KeyError, TypeError):
        message, code = data[:200].decode(errors="replace") or f"HTTP {status}", None
    return error_for_status(status, f"{deployment}: {message}", code)


def handle(deployment: str, *, url: str | None = None) -> DeploymentHandle:
    """A handle to ``deployment`` (resolved through its router; ``url`` overrides)."""
    return DeploymentHandle(deployment=deployment, url=(url or resolve(deployment)).rstrip("/"))
