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
  before any newcomer can take it). The table writes, then tells: every change, the index's
  included, is in before ``notify`` runs, so a waiter handed a slot from inside it reads the
  table as it now is. Reads never notify, so a reader that reads the table
  while handling a notification is never re-entered;
- the document fetcher, through :meth:`RoutingTable.wait_stale`.

The table keeps an index for the policy (:meth:`RoutingTable.pool`), updated by the writer
as each replica changes, so that a routing decision costs O(holders), not O(replicas):

- per model, the replicas holding it (loaded, loading, learned, or waiting for this router's
  load): a hit reads them directly;
- per model count (a *tier*), the ready replicas with that many models, each tier sorted by
  the replicas' points on a hash ring: a miss walks the fewest-models tier from the model's
  point and stops after a bounded sample (:data:`modelplex_router.policy.SAMPLE`).

Quarantine and a request's excluded replicas are filtered when the index is read (a few
replicas at most), readiness and holdings when it is written. Memory: one ring entry per
replica and one index entry per (model, holder) pair, i.e. linear in replicas + holdings.

All times come from the caller (a monotonic clock), so tests drive it with a fake one.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import logging
from typing import Any, Callable, Collection, Iterable, Iterator

from modelplex.wire.loaded import LoadedSummary
from modelplex_router.events import (Answered, ConnectionFailed, DocumentFetched, Event, ReplicaGone, ReplicaSeen,
                                     ReplicasListed, RequestFinished, RequestStarted, SummaryHeard, Unloaded)
from modelplex_router.policy import Pool, ring_point
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


class _Ring:
    """The replicas of one tier, sorted by their point on the hash ring."""

    __slots__ = ("_keys", "_members")

    def __init__(self) -> None:
        self._keys: list[tuple[int, str]] = []
        self._members: dict[str, Replica] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, replica: Replica) -> None:
        bisect.insort(self._keys, (replica.point, replica.name))
        self._members[replica.name] = replica

    def remove(self, replica: Replica) -> None:
        keys = self._keys
        del keys[bisect.bisect_left(keys, (replica.point, replica.name))]
        del self._members[replica.name]

    def walk(self, point: int) -> Iterator[Replica]:
        """Every member once, clockwise from ``point``."""
        keys, members = self._keys, self._members
        n = len(keys)
        start = bisect.bisect_left(keys, (point, ""))
        for k in range(n):
            yield members[keys[(start + k) % n][1]]


class _Pool(Pool[Replica]):
    """The table's usable replicas as the policy reads them, at one moment, less ``exclude``."""

    __slots__ = ("_table", "_back", "_exclude")

    def __init__(self, table: RoutingTable, back: float, exclude: Collection[str]):
        self._table, self._back, self._exclude = table, back, exclude

    def _usable(self, replica: Replica) -> bool:
        down = replica.down_at
        return (replica.ready and (down is None or down <= self._back)
                and not (self._exclude and replica.name in self._exclude))

    def __bool__(self) -> bool:
        return any(self._usable(r) for r in self._table._replicas.values())

    def everyone(self) -> list[Replica]:
        return [r for r in self._table._replicas.values() if self._usable(r)]

    def holders(self, model: str) -> list[Replica]:
        holding = self._table._holders.get(model)
        return [r for r in holding.values() if self._usable(r)] if holding else []

    def tiers(self, model: str) -> Iterator[Iterable[Replica]]:
        point = ring_point(model)
        tiers = self._table._tiers
        for count in sorted(tiers):
            yield (r for r in tiers[count].walk(point) if self._usable(r))


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
        #: The index (see the module): model -> its holders by name; model count -> ring of ready replicas.
        self._holders: dict[str, dict[str, Replica]] = {}
        self._tiers: dict[int, _Ring] = {}
        #: Replicas with learned models or a quarantine: what the time-based refresh looks at.
        self._timed: set[Replica] = set()
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

    def pool(self, now: float, exclude: Collection[str] = ()) -> Pool[Replica]:
        """The replicas a request may go to now, less ``exclude``, indexed for the policy
        (:func:`modelplex_router.policy.choose`); false when there is none. Valid until the
        next write."""
        if now >= self._next_refresh:
            self._refresh(now)
        return _Pool(self, now - self.quarantine_s, exclude)

    def holders(self, model: str) -> list[Replica]:
        """The replicas in the index as holding (or loading) ``model``, usable or not."""
        return list(self._holders.get(model, {}).values())

    def tier_sizes(self) -> dict[int, int]:
        """How many ready replicas hold each number of models (the index's tiers)."""
        return {count: len(ring) for count, ring in sorted(self._tiers.items())}

    def has_room(self, now: float, limit: int) -> bool:
        """Whether some usable replica has fewer than ``limit`` requests in flight."""
        pool = self.pool(now)
        return any(r.inflight < limit for r in pool.everyone())

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
                change = self._finished(event, now)
                self._index(event.started.replica)  # written first: a waiter told next sees it
                self._notify(change)
            case SummaryHeard():
                self._heard(event.replica, event.header)
            case Answered():
                event.replica.answered_at = now
            case ConnectionFailed():
                if event.replica.down_at is None:
                    event.replica.down_at = now
                    self._timed.add(event.replica)
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
                self._index(replica)
                self._notify(Change.CHANGED)
            case ReplicaGone():
                if (gone := self._replicas.pop(event.name, None)) is not None:
                    self._unindex(gone)
                    self._notify(Change.CHANGED)
            case ReplicasListed():
                keep = {seen.name for seen in event.replicas}
                for name in [n for n in self._replicas if n not in keep]:
                    self._unindex(self._replicas.pop(name))
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
        self._index(replica)
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
            self._index(replica)
        else:
            replica.in_slots += 1

    def _finished(self, finished: RequestFinished, now: float) -> Change:
        """Update the record; what to tell the waiters once the index is updated too."""
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
                    return Change.CHANGED
        if finished.ok and model:
            replica.learned[model] = now
            self._timed.add(replica)
        return Change.FREED

    def _refresh(self, now: float) -> None:
        # Time-based bookkeeping of the table's own records; no notification (reads never
        # notify): waiters wake at :meth:`quarantine_ends` by themselves. Only the replicas
        # with something timed are looked at, not the whole pool.
        self._next_refresh = now + _REFRESH_EVERY_S
        expired_before = now - self.learned_max_age_s
        for replica in list(self._timed):
            if replica.learned:
                expired = [m for m, t in replica.learned.items() if t <= expired_before]
                for model in expired:
                    del replica.learned[model]
                if expired:
                    self._index(replica)
            if replica.down_at is not None and now - replica.down_at >= self.quarantine_s:
                replica.down_at = None
            if not replica.learned and replica.down_at is None:
                self._timed.discard(replica)

    # -- the index ---------------------------------------------------------------------------

    def _index(self, replica: Replica) -> None:
        """File ``replica`` under what it holds now and in its tier (after any change to it). A
        record that has left the table (a request in flight to it ended) is not filed again."""
        if self._replicas.get(replica.name) is not replica:
            return
        held = replica.held()
        before = replica.indexed
        if held != before:
            for model in before - held:
                holding = self._holders[model]
                del holding[replica.name]
                if not holding:
                    del self._holders[model]
            for model in held - before:
                self._holders.setdefault(model, {})[replica.name] = replica
            replica.indexed = held
        tier = replica.model_count if replica.ready else None
        if tier != replica.tier:
            self._file(replica, tier)

    def _unindex(self, replica: Replica) -> None:
        """Take a replica that left the table out of the index."""
        for model in replica.indexed:
            holding = self._holders[model]
            del holding[replica.name]
            if not holding:
                del self._holders[model]
        replica.indexed = frozenset()
        self._file(replica, None)
        self._timed.discard(replica)

    def _file(self, replica: Replica, tier: int | None) -> None:
        if replica.tier is not None:
            ring = self._tiers[replica.tier]
            ring.remove(replica)
            if not ring:
                del self._tiers[replica.tier]
        if tier is not None:
            if tier not in self._tiers:
                self._tiers[tier] = _Ring()
            self._tiers[tier].add(replica)
        replica.tier = tier
