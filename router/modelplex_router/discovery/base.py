"""The discovery interface: a source that keeps a routing table current until cancelled."""

from __future__ import annotations

import abc
from typing import Callable

from modelplex.wire.loaded import LoadedModels
from modelplex_router.events import ReplicaSeen
from modelplex_router.record import Held
from modelplex_router.table import RoutingTable


class Discovery(abc.ABC):
    """Feeds a :class:`RoutingTable` with events: :class:`~modelplex_router.events.ReplicaSeen`
    snapshots, and for a source that lists, ``ReplicasListed`` and ``ReplicaGone``.

    ``lag_s``: how old a snapshot may already be when it reaches the table (the table then
    trusts what the router learned from its own traffic for that long).
    """

    lag_s: float = 0.0

    @abc.abstractmethod
    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        """Keep ``table`` current; runs until cancelled, surviving the source's errors."""


def unreachable(name: str, url: str) -> ReplicaSeen:
    """A replica that did not answer: not ready, holding nothing anyone knows of."""
    return ReplicaSeen(name, url, False, Held.of(LoadedModels()))
