"""The routing table: what the router believes about each replica, and how that belief changes.

It has one writer, :meth:`RoutingTable.apply`, which takes the news of
:mod:`modelplex_router.events`:

- discovery's snapshots of each replica (:mod:`modelplex_router.discovery`): address,
  readiness and its loaded-models document, or only the document's fixed-size summary (a pod
  annotation, a response header): a summary newer than the document the table holds marks the
  replica *stale*, and the document fetcher reads the replica's ``GET /v1/models``
  (:mod:`modelplex_router.discovery.documents`);
- the router's own dispatches: a request sent to R for M that R had not loaded marks M as
  *loading* on R until it finishes (so a burst for a new model lands on one replica), and
  the requests in flight per replica (for ``maxOngoingRequests`` and the two-choices pick).
  A request waiting for its model's load is counted apart, per model (``pending``), as the
  replica counts it: it takes none of the slots that requests for loaded models need;
- the router's own results: a success for M from R means R holds M now (*learned*), which
  keeps the view fresh between snapshots; a connection failure takes R out of rotation
  (*quarantine*) until discovery shows it alive again or the quarantine runs out.

Readers (the scheduler, the policy, the reports) read the records and never write them.

Two kinds of reader wait for news, each told its own way:

- the scheduler, through the ``notify`` function it gives the constructor, called after a
  change with a :class:`Change` (synchronously, so a freed slot goes to the oldest waiter
  before any newcomer can take it). Reads never notify, so a reader that reads the table
  while handling a notification is never re-entered;
- the document fetcher, through :meth:`RoutingTable.wait_stale`.

All times come from the caller (a monotonic clock), so tests drive it with a fake one.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Any, Callable

from modelplex.wire.loaded import LoadedSummary
from modelplex_router.events import (Answered, ConnectionFailed, DocumentFetched, Event, ReplicaGone, ReplicaSeen,
                                     ReplicasListed, RequestFinished, RequestStarted, SummaryHeard, Unloaded)
from modelplex_router.record import Held, Replica

log = logging.getLogger("modelplex.router.table")

#: How long a model learned from a response counts without discovery confirming it. Past
#: that, discovery has had time to report it (the replica publishes within ~100 ms).
LEARNED_MAX_AGE_S = 2.0
#: How long a replica that failed a connection stays out of rotation at most. Discovery
#: (a successful poll, a pod event) brings it back sooner.
QUARANTINE_S = 2.0
#: How often the time-based parts (learned expiry, quarantine) are re-checked, at most.
_REFRESH_EVERY_S = 0.05


class Change(enum.Enum):
    """What a notification says changed."""

    FREED = "freed"  # a request ended: its slot is free
    CHANGED = "changed"  # anything else a waiter may now fit: a replica came, went or changed, a load failed


Notify = Callable[[Change], None]


def _ignore(change: Change) -> None:
    """The notifier of a table nobody waits on."""


class RoutingTable:
    """The replicas of one deployment, keyed by name.

    ``lag_s`` is how stale a discovery snapshot may be when it arrives: 0 for polling (a poll
    started at T shows everything done before T), about 1 s for Kubernetes annotations. A
    learned model is dropped by a snapshot observed at least ``lag_s`` after it was learned.
    ``notify`` is told of every change a waiting request may care about (see the module).
    """

    def __init__(self, *, lag_s: float = 0.0, quarantine_s: float = QUARANTINE_S,
                 learned_max_age_s: float = LEARNED_MAX_AGE_S, notify: Notify = _ignore):
        self.lag_s = lag_s
        self.quarantine_s = quarantine_s
        self.learned_max_age_s = max(learned_max_age_s, lag_s)
        self._notify = notify
        self._replicas: dict[str, Replica] = {}
        self._next_refresh = float("-inf")
        self._stale = asyncio.Event()  # some replica's document is older than its last summary

    # -- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._replicas)

    def get(self, name: str) -> Replica | None:
        return self._replicas.get(name)

    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def usable(self, now: float) -> list[Replica]:
        """The replicas a request may go to now (ready, not quarantined), derived on each call:
        a pass over tens of replicas costs less than keeping a cached list right."""
        if now >= self._next_refresh:
            self._refresh(now)
        back = now - self.quarantine_s  # a failure at or before this is served out
        return [r for r in self._replicas.values() if r.ready and (r.down_at is None or r.down_at <= back)]

    def has_room(self, now: float, limit: int) -> bool:
        """Whether some usable replica has fewer than ``limit`` requests in flight."""
        return any(r.inflight < limit for r in self.usable(now))

    def quarantine_ends(self, now: float) -> float:
        """When the earliest quarantine still running at ``now`` runs out (``inf``: none). A
        waiter wakes then: the end of a quarantine is no event, nothing else tells it."""
        ends = (r.down_at + self.quarantine_s for r in self._replicas.values() if r.down_at is not None)
        return min((end for end in ends if end > now), default=float("inf"))

    def answered_since(self, name: str, since: float) -> bool:
        replica = self._replicas.get(name)
        return replica is not None and replica.answered_at >= since

    def stale_replicas(self) -> list[Replica]:
        """Replicas whose document is older than their last summary: to fetch."""
        return [r for r in self._replicas.values() if r.stale and r.url]

    async def wait_stale(self) -> None:
        """Return once a replica's document turned stale since the last call returned: the
        fetcher then reads :meth:`stale_replicas`."""
        await self._stale.wait()
        self._stale.clear()

    def snapshot(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in sorted(self._replicas.values(), key=lambda r: r.name)]

    # -- the one writer ----------------------------------------------------------------------

    def apply(self, event: Event, now: float) -> None:
        """Take in ``event``, which happened (or, for discovery, was observed) at ``now``."""
        match event:
            case RequestStarted():
                self._started(event)
            case RequestFinished():
                self._finished(event, now)
            case SummaryHeard():
                self._heard(event.replica, event.header)
            case Answered():
                event.replica.answered_at = now
            case ConnectionFailed():
                if event.replica.down_at is None:
                    event.replica.down_at = now
            case ReplicaSeen():
                if self._seen(event, now):
                    self._notify(Change.CHANGED)
            case DocumentFetched():
                current = self._replicas.get(event.name)  # None: gone while it was read
                if current is not None and self._seen(
                        ReplicaSeen(current.name, current.url, current.ready, Held.of(event.document)), now):
                    self._notify(Change.CHANGED)
            case Unloaded():
                replica = event.replica
                replica.models = replica.models - {event.model}
                replica.reported_loading = replica.reported_loading - {event.model}
                replica.learned.pop(event.model, None)
                self._notify(Change.CHANGED)
            case ReplicaGone():
                if self._replicas.pop(event.name, None) is not None:
                    self._notify(Change.CHANGED)
            case ReplicasListed():
                keep = {seen.name for seen in event.replicas}
                for name in [n for n in self._replicas if n not in keep]:
                    del self._replicas[name]
                for seen in event.replicas:
                    self._seen(seen, now)
                self._notify(Change.CHANGED)  # once, with the whole listing in
            case _:
                raise TypeError(f"not a routing table event: {event!r}")

    # -- internals ---------------------------------------------------------------------------

    def _seen(self, seen: ReplicaSeen, observed_at: float) -> bool:
        """Take in a snapshot; whether it changed anything a waiter may use."""
        replica = self._replicas.get(seen.name)
        if replica is None:
            replica = self._replicas[seen.name] = Replica(name=seen.name, url=seen.url)
        document = seen.held.document
        changed = replica.ready != seen.ready or replica.url != seen.url
        if document is not None:
            models, loading = frozenset(document.models), frozenset(document.loading)
            changed = changed or replica.models != models or replica.reported_loading != loading
            replica.document, replica.models, replica.reported_loading = document, models, loading
        replica.url = seen.url
        replica.ready = seen.ready
        replica.capacity = seen.held.summary.capacity
        replica.observed_at = observed_at
        settled = observed_at - self.lag_s
        if replica.learned:
            # What the snapshot shows is the truth for everything learned before it settled.
            for model in [m for m, t in replica.learned.items() if t <= settled]:
                del replica.learned[model]
                changed = True
        if replica.down_at is not None and seen.ready and replica.down_at <= settled:
            replica.down_at = None  # seen alive after it failed
            changed = True
        self._announced(replica, seen.held.summary.version)
        return changed

    def _heard(self, replica: Replica, header: str) -> None:
        if header != replica.heard_header:
            try:
                version = LoadedSummary.parse(header).version
            except ValueError:
                log.debug("replica %s sent a malformed loaded-models header", replica.name)
                return
            replica.heard_header, replica.heard_version = header, version
        self._announced(replica, replica.heard_version)

    def _announced(self, replica: Replica, version: int) -> None:
        """A summary says ``replica``'s document is at ``version``."""
        if version > replica.latest_version:
            replica.latest_version = version
        if replica.stale:
            self._stale.set()

    def _started(self, started: RequestStarted) -> None:
        replica = started.replica
        if started.for_load:
            replica.pending[started.model] = replica.pending.get(started.model, 0) + 1
        else:
            replica.in_slots += 1

    def _finished(self, finished: RequestFinished, now: float) -> None:
        replica, model = finished.started.replica, finished.started.model
        if not finished.started.for_load:
            replica.in_slots -= 1
        else:
            left = replica.pending.get(model, 0) - 1
            if left > 0:
                replica.pending[model] = left
            else:
                replica.pending.pop(model, None)
                if not finished.ok:
                    # The load it marked failed: requests waiting for it may go elsewhere now.
                    self._notify(Change.CHANGED)
                    return
        if finished.ok and model:
            replica.learned[model] = now
        self._notify(Change.FREED)

    def _refresh(self, now: float) -> None:
        # Time-based bookkeeping of the table's own records; no notification (reads never
        # notify): waiters wake at :meth:`quarantine_ends` by themselves.
        self._next_refresh = now + _REFRESH_EVERY_S
        expired_before = now - self.learned_max_age_s
        for replica in self._replicas.values():
            if replica.learned:
                for model in [m for m, t in replica.learned.items() if t <= expired_before]:
                    del replica.learned[model]
            if replica.down_at is not None and now - replica.down_at >= self.quarantine_s:
                replica.down_at = None

