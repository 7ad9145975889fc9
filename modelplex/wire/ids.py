"""Model ids: any printable string, as in Ray Serve, made safe where it is used.

An id names a model in a header, a path, a metric label, a file path, a URL or an S3 key.
Hugging Face ids (``meta-llama/Llama-2-7b-hf``), tags (``model:v2``) and tenants
(``user@tenant``) are all accepted. Only what no source can use is refused: empty ids, ids
over :data:`MAX_MODEL_ID_LENGTH` characters, control and invisible characters (newlines, NUL,
bidi overrides), surrounding whitespace (HTTP headers strip it) and ``.`` or ``..`` segments
(split on ``/`` and ``\\``, after percent-decoding: a store or an HTTP client that decodes
``%2E`` or ``%2F`` would otherwise climb out of the source's prefix). Everything else reaches
a model source through :func:`source_key`, which escapes what a path, URL or key could misread
instead of refusing it; user loaders join ids into paths with :func:`safe_join`.
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from urllib.parse import quote, unquote

from modelplex.wire.errors import BadRequest

MAX_MODEL_ID_LENGTH = 200
#: Unicode categories refused anywhere in an id: control, format (bidi, zero-width),
#: surrogate, private use, line and paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
#: Characters kept as they are inside a path segment: unreserved ones plus those RFC 3986
#: allows in a segment and no file system, S3 or URL parser reads specially there.
_SEGMENT_SAFE = "@:+=,~"


class InvalidModelId(BadRequest, ValueError):
    """A string that cannot be a model id (empty, too long, control characters, dot segments):
    a 400 wherever it reaches a client."""


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
    if has_dot_segment(model_id):
        raise InvalidModelId(f"model id {model_id!r} has a '.' or '..' segment (after percent-decoding): "
                             "an id cannot name a path outside its model source")
    return model_id


def checked_model_id(model_id: str) -> str:
    """``model_id`` as a request names it: "" stays "" (no model named), anything else must be
    a valid id (:class:`InvalidModelId`, a 400, otherwise)."""
    return _valid_id(model_id) if model_id else model_id


#: Valid ids already checked, most recent first: the same few ids come on every request, and
#: checking one (a pass over its characters, up to five rounds of percent-decoding) costs more
#: than the rest of a request's bookkeeping. An invalid id raises, so it is never kept.
_valid_id = functools.lru_cache(maxsize=4096)(validate_model_id)


_SEPARATORS = re.compile(r"[/\\]")
#: Decoding rounds looked through: a store that decodes twice (``%252E``) is caught too.
_DECODE_ROUNDS = 4


def has_dot_segment(model_id: str) -> bool:
    """Whether ``model_id`` has a ``.`` or ``..`` segment, split on ``/`` and ``\\``, as it
    stands or after up to :data:`_DECODE_ROUNDS` rounds of percent-decoding."""
    text = model_id
    for _ in range(_DECODE_ROUNDS + 1):
        if any(segment in (".", "..") for segment in _SEPARATORS.split(text)):
            return True
        decoded = unquote(text)
        if decoded == text:
            return False
        text = decoded
    return False


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


def safe_join(root: str | os.PathLike[str], model_id: str, suffix: str = "") -> str:
    """``root/<id><suffix>`` for a user loader, never outside ``root``.

    The id is checked (:func:`validate_model_id`: 400 for ``..`` and friends) and escaped by
    :func:`source_key`, so ``org/name`` keeps its folder and nothing else makes one; the result
    is checked once more against ``root`` after resolving links. Raises :class:`InvalidModelId`.
    """
    base = os.path.realpath(os.fspath(root))
    path = os.path.realpath(os.path.join(base, source_key(model_id) + suffix))
    if os.path.commonpath([base, path]) != base or path == base:
        raise InvalidModelId(f"model id {model_id!r} names a path outside the model folder")
    return path


def _escape(segment: str) -> str:
    escaped = quote(segment, safe=_SEGMENT_SAFE)
    return "%2E" * len(escaped) if escaped in (".", "..") else escaped
