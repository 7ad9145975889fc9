"""The one client of a replica's ``GET /v1/models`` (its loaded-models document).

The router's static discovery, the router's document fetcher and the operator all read the
document through :func:`fetch_loaded_models`, with the same limits: a time limit per read
(:data:`FETCH_TIMEOUT_S` unless the caller's poll has a shorter one) and a size limit
(:data:`modelplex.wire.loaded.MAX_DOCUMENT_BYTES`) checked on the announced length and again
while reading, so a replica that answers without a length cannot make the reader hold more.
Every way a read can fail comes back as one :class:`DocumentUnavailable` that says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp

from modelplex.wire.loaded import LOADED_MODELS_PATH, MAX_DOCUMENT_BYTES, LoadedModels, read_document

#: How long one read may take, body included.
FETCH_TIMEOUT_S = 3.0
_CHUNK = 1 << 16


class DocumentUnavailable(Exception):
    """``GET /v1/models`` gave no document; the message says why (for logs and status).

    ``refused``: nothing listens there (the connection was refused or reset before an answer).
    """

    def __init__(self, message: str, *, refused: bool = False):
        super().__init__(message)
        self.refused = refused


async def fetch_loaded_models(session: aiohttp.ClientSession, base_url: str, *,
                              timeout_s: float = FETCH_TIMEOUT_S,
                              headers: Mapping[str, str] | None = None) -> LoadedModels:
    """The document of the replica at ``base_url`` (``http://host:port``), read over ``session``
    with ``headers`` (the internal credential, where the session does not send it); raises
    :class:`DocumentUnavailable`."""
    try:
        async with session.get(base_url + LOADED_MODELS_PATH, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                raise DocumentUnavailable(f"answered HTTP {response.status}")
            if (response.content_length or 0) > MAX_DOCUMENT_BYTES:
                raise DocumentUnavailable(f"its document is over {MAX_DOCUMENT_BYTES} bytes")
            body = await _read_at_most(response, MAX_DOCUMENT_BYTES)
    except asyncio.TimeoutError:
        raise DocumentUnavailable(f"no answer within {timeout_s:g} s") from None
    except aiohttp.ClientConnectorError as error:
        raise DocumentUnavailable(str(error) or type(error).__name__, refused=True) from None
    except (aiohttp.ClientError, OSError) as error:
        raise DocumentUnavailable(str(error) or type(error).__name__) from None
    try:
        return read_document(body)
    except ValueError as error:
        raise DocumentUnavailable(f"malformed document: {error}") from None


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or :class:`DocumentUnavailable` as soon as it passes ``limit`` bytes."""
    body = bytearray()
    async for chunk in response.content.iter_chunked(_CHUNK):
        body += chunk
        if len(body) > limit:
            raise DocumentUnavailable(f"its document is over {limit} bytes")
    return bytes(body)
