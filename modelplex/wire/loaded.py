"""What a replica holds: the loaded-models contract between replica, router and operator.

Two shapes, typed once here:

- :class:`LoadedModels`, the full document: every loaded model (least recently used first),
  the loads in flight, sizes, and the latest load failures (:class:`LoadFailure`, at most
  :data:`MAX_FAILURES` model ids). ``GET /v1/models`` on the replica answers it. It grows with
  the number of models, so it never rides in a header or an annotation.
- :class:`LoadedSummary`, a fixed-size digest (counts, bytes, the document's version). It is
  the pod annotation ``modelplex.io/loaded-models`` (:func:`summary_annotations`,
  :func:`annotation_summary`) and the ``X-Modelplex-Loaded-Models`` header of every replica
  answer, whatever the number of models or the length of their ids. A reader that sees a
  version newer than the one it holds fetches the document.

This module is the only reader and writer of the three forms; the one client of
``GET /v1/models`` (:mod:`modelplex.loaded_client`) reads the body within
:data:`MAX_DOCUMENT_BYTES` and parses it with :func:`read_document`.

``version`` grows with every change of the document (a load, an eviction, a failed load), so
"newer" is a plain comparison. Fields are only ever added: a reader ignores what it does not
know, and a field missing from an older replica's document reads as empty.
"""

from __future__ import annotations

import builtins  # ``bytes`` is also a field of both shapes
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from modelplex.wire.names import ANNOTATION_LOADED_MODELS


def _count(raw: Any, name: str) -> int:
    value = raw.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected a count (got {value!r})")
    return value


def _ids(raw: Any, name: str) -> tuple[str, ...]:
    value = raw.get(name) or ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, str) for m in value):
        raise ValueError(f"{name}: expected a list of model ids")
    return tuple(value)


#: The replica's path that answers the full document (``GET``); one model's actions are below it
#: (``{LOADED_MODELS_PATH}/{model_id}/load``, ``DELETE {LOADED_MODELS_PATH}/{model_id}``).
LOADED_MODELS_PATH = "/v1/models"
#: Load failures a document keeps: the latest failure of each of this many model ids.
MAX_FAILURES = 20
#: A failure's error message is cut to this many characters.
MAX_ERROR_CHARS = 500
#: The largest ``GET /v1/models`` body a reader accepts (thousands of long ids fit many times
#: over): a replica that answers more is refused, not read into memory.
MAX_DOCUMENT_BYTES = 16 << 20


def _object(raw: Any) -> Mapping[str, Any]:
    document = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    if not isinstance(document, Mapping):
        raise ValueError("expected a JSON object")
    return document


@dataclass(frozen=True, slots=True)
class LoadedSummary:
    """The fixed-size digest of a :class:`LoadedModels` (annotation and header)."""

    version: int = 0
    models: int = 0
    loading: int = 0
    capacity: int = 0
    bytes: int = 0
    capacity_bytes: int = 0

    def to_json(self) -> str:
        return orjson.dumps({
            "version": self.version, "models": self.models, "loading": self.loading,
            "capacity": self.capacity, "bytes": self.bytes, "capacityBytes": self.capacity_bytes,
        }).decode()

    @classmethod
    def parse(cls, raw: str | builtins.bytes | Mapping[str, Any]) -> LoadedSummary:
        """From JSON text or a dict; raises ``ValueError`` when malformed."""
        document = _object(raw)
        return cls(_count(document, "version"), _count(document, "models"), _count(document, "loading"),
                   _count(document, "capacity"), _count(document, "bytes"), _count(document, "capacityBytes"))


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """The latest failed load of one model id on a replica."""

    model: str
    error: str  # the message its waiters got, at most MAX_ERROR_CHARS
    at: str  # when, RFC 3339 UTC (``2026-01-01T00:00:00Z``)
    count: int = 1  # failed loads of this id since the replica started

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "error": self.error, "at": self.at, "count": self.count}

    @classmethod
    def parse(cls, raw: Any) -> LoadFailure:
        if not isinstance(raw, Mapping):
            raise ValueError("failures: expected objects")
        model, error, at = raw.get("model"), raw.get("error", ""), raw.get("at", "")
        if not isinstance(model, str) or not isinstance(error, str) or not isinstance(at, str):
            raise ValueError("failures: expected model, error and at as strings")
        count = _count(raw, "count")
        if count < 1:
            raise ValueError("failures: count must be at least 1")
        return cls(model, error[:MAX_ERROR_CHARS], at, count)


@dataclass(frozen=True, slots=True)
class LoadedModels:
    """Everything a replica's model cache holds (``GET /v1/models``)."""

    version: int = 0
    capacity: int = 0  # models; 0: unknown
    models: tuple[str, ...] = ()  # least recently used first
    loading: tuple[str, ...] = ()
    model_bytes: Mapping[str, int] = field(default_factory=dict)  # measured size per loaded model
    capacity_bytes: int = 0  # 0: no byte budget
    failures: tuple[LoadFailure, ...] = ()  # the latest failure per model id, oldest first

    @property
    def bytes(self) -> int:
        return sum(self.model_bytes.values())

    def summary(self) -> LoadedSummary:
        return LoadedSummary(self.version, len(self.models), len(self.loading), self.capacity, self.bytes,
                             self.capacity_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "capacity": self.capacity, "models": list(self.models),
                "loading": list(self.loading), "modelBytes": dict(self.model_bytes),
                "capacityBytes": self.capacity_bytes, "failures": [f.to_dict() for f in self.failures]}

    @classmethod
    def parse(cls, raw: str | builtins.bytes | Mapping[str, Any]) -> LoadedModels:
        """From JSON text or a dict; raises ``ValueError`` when malformed."""
        document = _object(raw)
        sizes = document.get("modelBytes") or {}
        if not isinstance(sizes, Mapping) or not all(isinstance(v, int) and v >= 0 for v in sizes.values()):
            raise ValueError("modelBytes: expected sizes in bytes by model id")
        failures = document.get("failures") or ()
        if not isinstance(failures, (list, tuple)):
            raise ValueError("failures: expected a list")
        return cls(_count(document, "version"), _count(document, "capacity"), _ids(document, "models"),
                   _ids(document, "loading"), dict(sizes), _count(document, "capacityBytes"),
                   tuple(LoadFailure.parse(f) for f in failures[-MAX_FAILURES:]))


def read_document(body: bytes) -> LoadedModels:
    """A ``GET /v1/models`` body; raises ``ValueError`` when it is over
    :data:`MAX_DOCUMENT_BYTES` or malformed."""
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"the document is over {MAX_DOCUMENT_BYTES} bytes")
    return LoadedModels.parse(body)


def summary_annotations(summary: LoadedSummary) -> dict[str, str]:
    """The pod annotations that publish ``summary`` (fixed-size, whatever the models)."""
    return {ANNOTATION_LOADED_MODELS: summary.to_json()}


def annotation_summary(annotations: Mapping[str, str] | None) -> LoadedSummary:
    """The summary a replica pod's annotations carry: empty when it has none yet (a pod that
    just started); raises ``ValueError`` when the annotation is malformed."""
    raw = (annotations or {}).get(ANNOTATION_LOADED_MODELS)
    if not raw:
        return LoadedSummary()
    try:
        return LoadedSummary.parse(raw)
    except ValueError as error:
        raise ValueError(f"annotation {ANNOTATION_LOADED_MODELS}: {error}") from None
