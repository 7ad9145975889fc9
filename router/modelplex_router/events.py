"""What the routing table is told: one type per kind of news, each applied by
:meth:`modelplex_router.table.RoutingTable.apply`.

Who sends what:

- discovery (:mod:`modelplex_router.discovery`): :class:`ReplicaSeen` (a poll, a pod event),
  :class:`ReplicasListed` (a full pod list), :class:`ReplicaGone` (a pod deleted);
- the document fetcher: :class:`DocumentFetched`;
- the scheduler, when it places a request: :class:`RequestStarted`; the request's lease, when
  the proxy releases it: :class:`RequestFinished`;
- the proxy, from a replica's answers: :class:`Answered`, :class:`ConnectionFailed`,
  :class:`SummaryHeard`.

Replicas are named by name in discovery's news and by their record in the router's own (a
request in flight belongs to the record it was sent to, even if that replica has left the
table since).
"""

from __future__ import annotations

from dataclasses import dataclass

from modelplex.wire.loaded import LoadedModels
from modelplex_router.record import Held, Replica


@dataclass(frozen=True, slots=True)
class ReplicaSeen:
    """Discovery saw a replica: its address, its readiness and what it holds."""

    name: str
    url: str
    ready: bool
    held: Held


@dataclass(frozen=True, slots=True)
class ReplicasListed:
    """A full listing: these replicas, and no others."""

    replicas: tuple[ReplicaSeen, ...]


@dataclass(frozen=True, slots=True)
class ReplicaGone:
    """The replica is gone (pod deleted, no longer configured)."""

    name: str


@dataclass(frozen=True, slots=True)
class DocumentFetched:
    """The replica's ``GET /v1/models`` answered ``document`` (it is as ready as it was)."""

    name: str
    document: LoadedModels


@dataclass(frozen=True, slots=True)
class Unloaded:
    """This router evicted ``model`` from the replica (its unload answered): the table drops it at
    once, not a document fetch later."""

    replica: Replica
    model: str


@dataclass(frozen=True, slots=True)
class SummaryHeard:
    """A replica's answer carried the loaded-models summary header ``header`` (raw text)."""

    replica: Replica
    header: str


@dataclass(frozen=True, slots=True)
class Answered:
    """The replica answered a request (any status): it is alive, whatever its polls say."""

    replica: Replica


@dataclass(frozen=True, slots=True)
class ConnectionFailed:
    """A connection to the replica failed or it sent nothing in time: out of rotation until
    discovery sees it alive again, or the quarantine runs out."""

    replica: Replica


@dataclass(frozen=True, slots=True)
class RequestStarted:
    """A request for ``model`` ("" for none) goes to ``replica``. ``for_load``: its model was
    not loaded there, so it waits for the load (in the model's queue), not in a slot."""

    replica: Replica
    model: str
    for_load: bool

    @classmethod
    def to(cls, replica: Replica, model: str) -> RequestStarted:
        """The start of a request for ``model`` on ``replica``, as the replica stands now."""
        return cls(replica, model, bool(model) and not replica.loaded(model))


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """The request ended; ``ok``: the replica answered it successfully (so it holds the model)."""

    started: RequestStarted
    ok: bool


Event = (ReplicaSeen | ReplicasListed | ReplicaGone | DocumentFetched | SummaryHeard | Answered | ConnectionFailed
         | RequestStarted | RequestFinished | Unloaded)
