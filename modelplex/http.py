"""aiohttp pieces shared by the replica and the router: the error middleware, JSON bodies, and
the small rules of the request path (the model-id header, hop-by-hop headers), each written once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable, Mapping, Protocol

import aiohttp
import orjson
from aiohttp import web

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, DeploymentCredential, internal_token_file
from modelplex.wire.errors import ModelplexError, RequestTimeout, error_document
from modelplex.wire.names import DASHED_MODEL_ID_HEADER, MODEL_ID_HEADER

log = logging.getLogger(__name__)

JSON_CONTENT_TYPES = ("application/json",)

#: Headers that describe one hop of a connection, not the message (RFC 9110 7.6.1, and the
#: framing of the body): a proxy never passes them on. Lower case; each relay adds what it
#: sets itself (``Content-Length``, ``Host``, ...).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade"})


def model_id_of(headers: Mapping[str, str]) -> str:
    """The model a request names in its headers: Ray Serve's ``serve_multiplexed_model_id``, or
    its dashed spelling (which proxies that drop underscores keep); "" for none."""
    return headers.get(MODEL_ID_HEADER) or headers.get(DASHED_MODEL_ID_HEADER) or ""


def error_response(status: int, code: str, message: str, *, retry_after: float | None = None) -> web.Response:
    """The JSON error (:func:`~modelplex.wire.errors.error_document`) as an answer."""
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
    return web.json_response(error_document(code, message), status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Turn every failure into ``{"error": {"code", "message"}}`` with the right status."""
    try:
        return await handler(request)
    except ModelplexError as error:
        return web.json_response(error.to_dict(), status=error.status, headers=error.response_headers())
    except web.HTTPRequestEntityTooLarge as error:
        return error_response(413, "payload_too_large", error.text or "request body too large")
    except web.HTTPException as error:
        if error.status < 400:
            raise
        code = error.reason.lower().replace(" ", "_")
        return error_response(error.status, code, f"{error.reason}: {request.method} {request.path}")
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal", "internal error; see the server log")


def is_json(content_type: str) -> bool:
    return content_type in JSON_CONTENT_TYPES or content_type.endswith("+json")


def to_json(value: Any) -> bytes:
    """JSON bytes; numpy arrays (and so ``tensor.numpy()``) are written natively, fast."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def from_json(data: bytes | str) -> Any:
    """Parse JSON; raises ``ValueError`` on malformed input."""
    return orjson.loads(data)


def encode_body(value: Any) -> tuple[bytes, str]:
    """A handler's return value as (body, content type): bytes raw, str as text, else JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), "application/octet-stream"
    if isinstance(value, str):
        return value.encode(), "text/plain; charset=utf-8"
    return to_json(value), "application/json"


def sending_token(token: Callable[[], str | None],
                  fallback: Callable[[], str | None] | None = None) -> aiohttp.ClientMiddlewareType:
    """A client middleware that sends ``token()`` (read per request, so a rotated value is used
    from the next request) as the internal credential. Refused with it (401), a request is sent
    once more with ``fallback()`` where that differs: during the upgrade from a namespace
    credential a pod sends the namespace's token, which a router done with its own upgrade refuses."""

    async def send(request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        value = token()
        if value is not None:
            request.headers[INTERNAL_TOKEN_HEADER] = value
        response = await handler(request)
        other = fallback() if fallback is not None and response.status == 401 else None
        if other is None or other == value:
            return response
        response.release()
        request.headers[INTERNAL_TOKEN_HEADER] = other
        return await handler(request)

    return send


def internal_session(**options: Any) -> aiohttp.ClientSession:
    """A client session for the deployment's own components: it sends this process's internal
    credential (``MODELPLEX_INTERNAL_TOKEN_FILE``) with every request, where there is one."""
    token = internal_token_file()
    own = token.own if isinstance(token, DeploymentCredential) else None
    middlewares = (sending_token(token.token, own),) if token is not None else ()
    return aiohttp.ClientSession(middlewares=middlewares, **options)


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body within ``timeout_s`` (``spec.router.bodyTimeoutSeconds``), else
    :class:`RequestTimeout` (408): a client trickling its body holds nothing for long."""
    if request.content.is_eof():  # it came whole with the headers (the usual case): nothing to time
        return await request.read()
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()  # over client_max_size: HTTPRequestEntityTooLarge → 413
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s "
                             "(spec.router.bodyTimeoutSeconds)") from None


class StreamIdle(ConnectionResetError):
    """A stream's client read nothing of what was sent for ``spec.router.streamIdleTimeoutSeconds``:
    the stream was cut. A client that stopped reading is a client that left (499)."""


async def write_chunk(request: web.Request, response: web.StreamResponse, data: bytes, idle_timeout_s: float) -> None:
    """Write one chunk of a streamed answer. Only the wait for unsent data to drain is bounded
    (the client stopped reading), never a producer's silence between chunks: past
    ``idle_timeout_s`` the connection is aborted (its unsent data dropped, so nothing waits on it
    again) and :class:`StreamIdle` raised, which frees the stream's slot."""
    try:
        async with asyncio.timeout(idle_timeout_s):
            await response.write(data)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise StreamIdle(f"the client read nothing for {idle_timeout_s:g} s (spec.router.streamIdleTimeoutSeconds): "
                         "stream cut") from None


#: The status of a request whose client left before its answer (metrics and logs only, as nginx's).
CLIENT_CLOSED = 499


class ChunkReader(Protocol):
    """An answer's body read as its sender framed it (:class:`aiohttp.StreamReader`, the router's
    :class:`~modelplex_router.upstream.Body`)."""

    async def readchunk(self) -> tuple[bytes, bool]: ...

    def at_eof(self) -> bool: ...


async def first_chunk(content: ChunkReader) -> bytes:
    """The first HTTP chunk of an upstream answer (b"": its body is empty), read alone: chunks
    that arrived with it stay for :func:`upstream_chunks`."""
    while True:
        data, _ = await content.readchunk()
        if data or content.at_eof():
            return data


async def upstream_chunks(content: ChunkReader) -> AsyncIterator[bytes]:
    """An upstream answer's body as its sender framed it: each HTTP chunk it sent (one larger
    than the read buffer in pieces), never two merged, so a streaming client reads one chunk
    per item through a proxy as it would from the replica (Ray sends one per yield)."""
    while True:
        data, end = await content.readchunk()
        if data:
            yield data
        elif not end:
            return


def status_of(error: BaseException) -> int:
    """The status a request that raised ``error`` is counted under: the error's own, 499 when the
    client left (a tab closed: not the server's error), else 500."""
    if isinstance(error, (ModelplexError, web.HTTPException)):
        return error.status
    if isinstance(error, (ConnectionResetError, asyncio.CancelledError)):
        return CLIENT_CLOSED
    return 500
