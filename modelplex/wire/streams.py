"""How a stream that fails part way ends: the error frame, written by the replica (and by a
router that loses the replica mid-stream) and read by clients.

The status line went out with the first chunk, so the failure travels in the stream itself:

- Server-Sent Events (``Accept: text/event-stream``): an event named :data:`SSE_ERROR_EVENT`
  whose data is the JSON error document (``{"error": {"code", "message"}}``);
- NDJSON: one last line, the JSON error document;
- raw text or bytes: no frame (it would read as data); the cut connection is the signal;
- a typed stream through a handle: :func:`modelplex.wire.codec.encode_stream_error`.

The connection is cut after the frame either way.
"""

from __future__ import annotations

from typing import Any

import orjson

from modelplex.wire.errors import ModelplexError, error_object

#: The SSE event name of the error frame.
SSE_ERROR_EVENT = "error"


def sse_error_frame(error: ModelplexError) -> bytes:
    """The SSE event that ends a failed stream."""
    return f"event: {SSE_ERROR_EVENT}\ndata: ".encode() + orjson.dumps(error.to_dict()) + b"\n\n"


def ndjson_error_frame(error: ModelplexError) -> bytes:
    """The NDJSON line that ends a failed stream."""
    return orjson.dumps(error.to_dict()) + b"\n"


def stream_error(event: str, data: Any) -> dict[str, Any] | None:
    """The error object (``code``, ``message``, maybe ``type``) if a stream's record is its error
    frame, else None. ``event`` is the SSE event name (``""`` for NDJSON and unnamed events),
    ``data`` the record parsed as JSON. An NDJSON record is an error frame when it is the error
    document, so a handler's own records should not be ``{"error": {...}}`` objects."""
    if event not in ("", SSE_ERROR_EVENT):
        return None
    found = error_object(data)
    if found is None or (event == "" and not isinstance(found.get("code"), str)):
        return None
    return found
