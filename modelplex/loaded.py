"""What a replica holds: the loaded-models contract between replica, router and operator.

Two shapes, typed once here:

- :class:`LoadedModels`, the full document: every loaded model (least recently used first),
  the loads in flight, sizes. ``GET /v1/models`` on the replica answers it. It grows with the
  number of models, so it never rides in a header or an annotation.
- :class:`LoadedSummary`, a fixed-size digest (counts, bytes, the document's version). It is
  the pod annotation ``modelplex.io/loaded-models`` and the ``X-Modelplex-Loaded-Models``
  header of every replica answer, whatever the number of models or the length of their ids.
  A reader that sees a version newer than the one it holds fetches the document.

``version`` grows with every change of the loaded set, so "newer" is a plain comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson


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
    def parse(cls, raw: str | bytes | Mapping[str, Any]) -> LoadedSummary:
        """From JSON text or a dict; raises ``ValueError`` when malformed."""
        document = _object(raw)
        return cls(_count(document, "version"), _count(document, "models"), _count(document, "loading"),
                   _count(document, "capacity"), _count(document, "bytes"), _count(document, "capacityBytes"))


@dataclass(frozen=True, slots=True)
class LoadedModels:
    """Everything a replica's model cache holds (``GET /v1/models``)."""

    version: int = 0
    capacity: int = 0  # models; 0: unknown
    models: tuple[str, ...] = ()  # least recently used first
    loading: tuple[str, ...] = ()
    model_bytes: Mapping[str, int] = field(default_factory=dict)  # measured size per loaded model
    capacity_bytes: int = 0  # 0: no byte budget

    @property
    def bytes(self) -> int:
        return sum(self.model_bytes.values())

    def summary(self) -> LoadedSummary:
        return LoadedSummary(self.version, len(self.models), len(self.loading), self.capacity, self.bytes,
                             self.capacity_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "capacity": self.capacity, "models": list(self.models),
                "loading": list(self.loading), "modelBytes": dict(self.model_bytes),
                "capacityBytes": self.capacity_bytes}

    @classmethod
    def parse(cls, raw: str | bytes | Mapping[str, Any]) -> LoadedModels:
        """From JSON text or a dict; raises ``ValueError`` when malformed."""
        document = _object(raw)
        sizes = document.get("modelBytes") or {}
        if not isinstance(sizes, Mapping) or not all(isinstance(v, int) and v >= 0 for v in sizes.values()):
            raise ValueError("modelBytes: expected sizes in bytes by model id")
        return cls(_count(document, "version"), _count(document, "capacity"), _ids(document, "models"),
                   _ids(document, "loading"), dict(sizes), _count(document, "capacityBytes"))
