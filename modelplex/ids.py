"""Model id checks: an id becomes a path, a URL and an S3 key, so only safe ids get through."""

import re

MAX_MODEL_ID_LENGTH = 200
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


class InvalidModelId(ValueError):
    """A model id that could escape its model source (or is not an id at all)."""


def validate_model_id(model_id: str) -> str:
    """Return ``model_id`` if it is safe to put into a file path, URL or S3 key; raise otherwise.

    Allowed: letters, digits, ``_``, ``-`` and ``.``, not starting with ``.`` or ``-`` and never
    ``..``. That refuses path separators, absolute paths, percent-encoding, ``?``/``#``/``@``
    URL tricks, whitespace and control characters before anything is read.
    """
    if not model_id:
        raise InvalidModelId("model id is empty")
    if len(model_id) > MAX_MODEL_ID_LENGTH:
        raise InvalidModelId(f"model id is longer than {MAX_MODEL_ID_LENGTH} characters")
    if not _SAFE.fullmatch(model_id) or ".." in model_id:
        raise InvalidModelId(
            f"model id {model_id!r} is not allowed: use letters, digits, '_', '-' and '.', "
            "not starting with '.' or '-' and without '..'"
        )
    return model_id
