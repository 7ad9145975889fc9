"""The discovery interface: a source that keeps a routing table current until cancelled."""

from __future__ import annotations

import abc
import json
import logging
from typing import Any, Callable

from modelplex_router.table import ReplicaInfo, RoutingTable

log = logging.getLogger("modelplex.router.discovery")


class Discovery(abc.ABC):
    """Feeds a :class:`RoutingTable` with :class:`ReplicaInfo` snapshots.

    ``lag_s``: how old a snapshot may already be when it reaches the table (the table then
    trusts what the router learned from its own traffic for that long).
    """

    lag_s: float = 0.0

    @abc.abstractmethod
    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        """Keep ``table`` current; runs until cancelled, surviving the source's errors."""


def parse_models_document(raw: Any, *, source: str = "") -> tuple[tuple[str, ...], int, int, tuple[str, ...]]:
    """``{"models": [...], "capacity": N, "version": V, "loading": [...]}`` (a dict or JSON text)
    as (models, capacity, version, loading). Anything malformed reads as nothing loaded."""
    try:
        doc = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        models = tuple(str(m) for m in doc.get("models") or ())
        loading = tuple(str(m) for m in doc.get("loading") or ())
        capacity = int(doc.get("capacity") or 0)
        version = int(doc.get("version") or 0)
    except (ValueError, TypeError) as error:
        log.warning("ignoring a malformed loaded-models document%s: %s", f" from {source}" if source else "", error)
        return (), 0, 0, ()
    return models, capacity, version, loading


def unreachable(name: str, url: str) -> ReplicaInfo:
    return ReplicaInfo(name=name, url=url, ready=False)
