"""The discovery interface: a source that keeps a routing table current until cancelled."""

from __future__ import annotations

import abc
from typing import Callable

from modelplex_router.table import ReplicaInfo, RoutingTable


class Discovery(abc.ABC):
    """Feeds a :class:`RoutingTable` with :class:`ReplicaInfo` snapshots.

    ``lag_s``: how old a snapshot may already be when it reaches the table (the table then
    trusts what the router learned from its own traffic for that long).
    """

    lag_s: float = 0.0

    @abc.abstractmethod
    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        """Keep ``table`` current; runs until cancelled, surviving the source's errors."""


def unreachable(name: str, url: str) -> ReplicaInfo:
    return ReplicaInfo(name=name, url=url, ready=False)
