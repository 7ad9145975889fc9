"""How a replica ends a streamed (chunked) response that failed part way."""

from __future__ import annotations

from aiohttp import web

#: Set on a response cut part way: the replica's metrics count it as a 500, whatever its status line.
STREAM_FAILED = "modelplex_stream_failed"


def cut_stream(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """Close the connection before aiohttp could end the chunked body, so the client sees a cut,
    not a complete answer; returns ``response`` marked :data:`STREAM_FAILED`."""
    if request.transport is not None:
        request.transport.close()
    response[STREAM_FAILED] = True
    return response
