"""Model ids: any printable string, as in Ray Serve, made safe where it is used.

An id names a model in a header, a path, a metric label, a file path, a URL or an S3 key.
Hugging Face ids (``meta-llama/Llama-2-7b-hf``), tags (``model:v2``) and tenants
(``user@tenant``) are all accepted. Only what no source can use is refused: empty ids, ids
over :data:`MAX_MODEL_ID_LENGTH` characters, control and invisible characters (newlines, NUL,
bidi overrides) and surrounding whitespace (HTTP headers strip it). Everything else reaches a
model source through :func:`source_key`, which escapes what a path, URL or key could misread
instead of refusing it.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import quote

MAX_MODEL_ID_LENGTH = 200
#: Unicode categories refused anywhere in an id: control, format (bidi, zero-width),
#: surrogate, private use, line and paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
#: Characters kept as they are inside a path segment: unreserved ones plus those RFC 3986
#: allows in a segment and no file system, S3 or URL parser reads specially there.
_SEGMENT_SAFE = "@:+=,~"


class InvalidModelId(ValueError):
    """A string that cannot be a model id (empty, too long, control characters)."""


def validate_model_id(model_id: str) -> str:
    """Return ``model_id`` if it can name a model; raise :class:`InvalidModelId` otherwise."""
    if not isinstance(model_id, str):
        raise InvalidModelId(f"model id must be a string (got {type(model_id).__name__})")
    if not model_id:
        raise InvalidModelId("model id is empty")
    if len(model_id) > MAX_MODEL_ID_LENGTH:
        raise InvalidModelId(f"model id is longer than {MAX_MODEL_ID_LENGTH} characters")
    for char in model_id:
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise InvalidModelId(f"model id {model_id!r} contains the control or invisible character {char!r}")
    if model_id != model_id.strip():
        raise InvalidModelId(f"model id {model_id!r} starts or ends with whitespace")
    return model_id


def source_key(model_id: str) -> str:
    """The id as a relative path, URL path or S3 key inside a model source.

    An id of plain ``/``-separated names (``org/name``) keeps its folders; each name is
    percent-escaped (``%``, ``?``, ``#``, ``\\``, spaces and non-ASCII), so it stays one
    segment. An id with an empty, ``.`` or ``..`` segment (``../x``, ``/etc/passwd``, ``a//b``)
    becomes one escaped segment, ``/`` included: no id can climb out of its source, start at
    the root, or add a query or a fragment.
    """
    validate_model_id(model_id)
    segments = model_id.split("/")
    if all(segment not in ("", ".", "..") for segment in segments):
        return "/".join(_escape(segment) for segment in segments)
    return _escape(model_id)


def _escape(segment: str) -> str:
    escaped = quote(segment, safe=_SEGMENT_SAFE)
    return "%2E" * len(escaped) if escaped in (".", "..") else escaped
