"""The components' own logs as ``spec.logging`` says: their level, and ``TEXT`` or ``JSON`` lines.

The router and the replica call :func:`configure` once their manifest is read (in pods and in
local mode alike: local mode runs the same commands). ``JSON`` writes one object a line with
Ray's keys (``asctime``, ``levelname``, ``name``, ``message``, ``filename``, ``lineno``, and
``exc_text`` for an exception), for log collectors that parse JSON.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from modelplex.wire.spec import Logging

#: The TEXT lines: the command line's format, before and after the manifest is read.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object a line (Ray's ``encoding: JSON`` keys)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "asctime": self.formatTime(record), "levelname": record.levelname, "name": record.name,
            "message": record.getMessage(), "filename": record.filename, "lineno": record.lineno,
        }
        if record.exc_info:
            entry["exc_text"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_text"] = record.exc_text
        return orjson.dumps(entry).decode()


def formatter(encoding: str) -> logging.Formatter:
    """The formatter of ``encoding`` (``TEXT`` or ``JSON``)."""
    return JsonFormatter() if encoding == "JSON" else logging.Formatter(TEXT_FORMAT)


def configure(spec: Logging, root: logging.Logger | None = None) -> None:
    """Apply ``spec`` to the root logger's handlers: its level where set, its encoding always."""
    root = root or logging.getLogger()
    if spec.level is not None:
        root.setLevel(spec.level)
    for handler in root.handlers:
        handler.setFormatter(formatter(spec.encoding))
