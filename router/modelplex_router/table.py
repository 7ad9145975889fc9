"""The routing table: what the router believes about each replica, and how that belief changes.

Three things feed it:

- the discovery source (:mod:`modelplex_router.discovery`), with snapshots of each replica:
  address, readiness and its loaded-models document, or only the document's fixed-size
  summary (a pod annotation, a response header): a summary newer than the document the table
  holds marks the replica *stale*, and the document fetcher reads the replica's
  ``GET /v1/models`` (:mod:`modelplex_router.discovery.documents`);
- the router's own dispatches: a request sent to R for M that R had not loaded marks M as
  *loading* on R until it finishes (so a burst for a new model lands on one replica), and
  the requests in flight per replica (for ``maxOngoingRequests`` and the two-choices pick).
  A request waiting for its model's load is counted apart, per model (``pending``), as the
  replica counts it: it takes none of the slots that requests for loaded models need;
- the router's own results: a success for M from R means R holds M now (*learned*), which
  keeps the view fresh between snapshots; a connection failure takes R out of rotation
  (*quarantine*) until discovery shows it alive again or the quarantine runs out.

All times come from the caller (a monotonic clock), so tests drive it with a fake one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

#: How long a model learned from a response counts without discovery confirming it. Past
#: that, discovery has had time to report it (the replica publishes within ~100 ms).
LEARNED_MAX_AGE_S = 2.0
#: How long a replica that failed a connection stays out of rotation at most. Discovery
#: (a successful poll, a pod event) brings it back sooner.
QUARANTINE_S = 2.0
#: How often the time-based parts (learned expiry, quarantine) are re-checked, at most.
_REFRESH_EVERY_S = 0.05


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One replica as a discovery source sees it. ``models`` and ``loading`` are ``None`` when
    the source saw only the summary: ``version`` then says what there is to fetch."""

    name: str
    url: str
    ready: bool
    models: tuple[str, ...] | None = ()
    capacity: int = 0  # 0: unknown
    version: int = 0
    loading: tuple[str, ...] | None = ()


@dataclass(eq=False, slots=True)
class Replica:
    """A replica in the table: discovery's snapshot plus the router's own bookkeeping."""

    name: str
    url: str
    ready: bool = False
    models: frozenset[str] = frozenset()
    reported_loading: frozenset[str] = frozenset()
    capacity: int = 0
    version: int = 0  # of the document ``models`` and ``reported_loading`` come from
    latest_version: int = 0  # the newest version a summary announced
    observed_at: float = float("-inf")
    #: Requests this router sent while their model was loaded there (or that named none).
    in_slots: int = 0
    # model -> requests in flight that were sent while the model was not loaded here
    pending: dict[str, int] = field(default_factory=dict)
    # model -> when a success for it came back from here
    learned: dict[str, float] = field(default_factory=dict)
    down_at: float | None = None  # last connection failure, while quarantined
    answered_at: float = float("-inf")  # when it last answered a request (any status)
    heard_summary: tuple[str, int] = ("", 0)  # the last summary header its answers carried, its version

    @property
    def inflight(self) -> int:
        """Requests in the replica's slots (``maxOngoingRequests``): those sent for a loaded
        model, and those that waited for a load that has finished since."""
        if not self.pending:
            return self.in_slots
        return self.in_slots + sum(count for model, count in self.pending.items() if self.loaded(model))

    @inflight.setter
    def inflight(self, value: int) -> None:
        self.in_slots = value

    @property
    def stale(self) -> bool:
        return self.latest_version > self.version

    def loaded(self, model: str) -> bool:
        return model in self.models or model in self.learned

    def is_loading(self, model: str) -> bool:
        return (model in self.pending or model in self.reported_loading) and not self.loaded(model)

    def waiting(self, model: str) -> int:
        """This router's requests for ``model`` sent here while it was not loaded (waiting for
        its load while it is not loaded yet)."""
        return self.pending.get(model, 0)

    def holds(self, model: str) -> bool:
        return (
            model in self.models
            or model in self.learned
            or model in self.pending
            or model in self.reported_loading
        )

    def all_models(self) -> set[str]:
        return set(self.models).union(self.learned)

    def all_loading(self) -> set[str]:
        return set(self.pending).union(self.reported_loading).difference(self.models, self.learned)

    @property
    def model_count(self) -> int:
        count = len(self.all_models() | self.all_loading())
        # The replica evicts past its capacity; count at most that so that full replicas tie
        # (and the stable hash decides) instead of the one we happen to know less about winning.
        return min(count, self.capacity) if self.capacity > 0 else count

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "url": self.url,
            "ready": self.ready and self.down_at is None,
            "models": sorted(self.all_models()),
            "loading": sorted(self.all_loading()),
            "inflight": self.inflight,
            "waiting_for_load": sum(self.pending.values()) - (self.inflight - self.in_slots),
            "capacity": self.capacity,
            "version": self.version,
        }


class RoutingTable:
    """The replicas of one deployment, keyed by name.

    ``lag_s`` is how stale a discovery snapshot may be when it arrives: 0 for polling (a poll
    started at T shows everything done before T), about 1 s for Kubernetes annotations. A
    learned model is dropped by a snapshot observed at least ``lag_s`` after it was learned.
    """

    def __init__(self, *, lag_s: float = 0.0, quarantine_s: float = QUARANTINE_S,
                 learned_max_age_s: float = LEARNED_MAX_AGE_S):
        self.lag_s = lag_s
        self.quarantine_s = quarantine_s
        self.learned_max_age_s = max(learned_max_age_s, lag_s)
        self._replicas: dict[str, Replica] = {}
        self._next_refresh = float("-inf")
        #: Called with ``True`` when a slot frees up, ``False`` when anything else changed
        #: (a replica came or went, a load showed up): the scheduler hands slots to waiters.
        self.listener: Callable[[bool], None] | None = None
        #: Called when a replica's document is older than its last summary (the fetcher listens).
        self.stale_listener: Callable[[], None] | None = None

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
        return [r for r in self._replicas.values() if r.ready and r.down_at is None]

    def snapshot(self) -> list[dict]:
        return [r.to_dict() for r in sorted(self._replicas.values(), key=lambda r: r.name)]

    # -- discovery ---------------------------------------------------------------------------

    def apply(self, info: ReplicaInfo, observed_at: float) -> None:
        """Take in one replica's state as discovery saw it at ``observed_at``."""
        replica = self._replicas.get(info.name)
        if replica is None:
            replica = self._replicas[info.name] = Replica(name=info.name, url=info.url)
        models = replica.models if info.models is None else frozenset(info.models)
        loading = replica.reported_loading if info.loading is None else frozenset(info.loading)
        changed = (
            replica.ready != info.ready
            or replica.url != info.url
            or replica.models != models
            or replica.reported_loading != loading
        )
        replica.url = info.url
        replica.ready = info.ready
        replica.models = models
        replica.reported_loading = loading
        replica.capacity = info.capacity
        if info.models is not None:
            replica.version = info.version
        replica.observed_at = observed_at
        settled = observed_at - self.lag_s
        if replica.learned:
            # What the snapshot shows is the truth for everything learned before it settled.
            for model in [m for m, t in replica.learned.items() if t <= settled]:
                del replica.learned[model]
                changed = True
        if replica.down_at is not None and info.ready and replica.down_at <= settled:
            replica.down_at = None  # seen alive after it failed
            changed = True
        if changed:
            self._notify(False)
        self.heard_version(replica, info.version)

    def heard_version(self, replica: Replica, version: int) -> None:
        """A summary (annotation, response header) says ``replica``'s document is at ``version``."""
        if version > replica.latest_version:
            replica.latest_version = version
        if replica.stale and self.stale_listener is not None:
            self.stale_listener()

    def stale_replicas(self) -> list[Replica]:
        """Replicas whose document is older than their last summary: to fetch."""
        return [r for r in self._replicas.values() if r.stale and r.url]

    def remove(self, name: str) -> None:
        """The replica is gone (pod deleted, no longer configured)."""
        if self._replicas.pop(name, None) is not None:
            self._changed_now()

    def replace_all(self, infos: Iterable[ReplicaInfo], observed_at: float) -> None:
        """A full listing: apply each, drop the replicas not in it."""
        infos = list(infos)
        keep = {info.name for info in infos}
        for name in [n for n in self._replicas if n not in keep]:
            del self._replicas[name]
        for info in infos:
            self.apply(info, observed_at)
        self._changed_now()

    # -- the router's own traffic ------------------------------------------------------------

    def dispatched(self, replica: Replica, model: str) -> bool:
        """A request for ``model`` goes to ``replica``; returns whether it marked a load (then
        it waits for the load, not in a slot)."""
        if model and not replica.loaded(model):
            replica.pending[model] = replica.pending.get(model, 0) + 1
            return True
        replica.in_slots += 1
        return False

    def finished(self, replica: Replica, model: str, marked_load: bool, ok: bool, now: float) -> None:
        """The request ended; ``ok``: the replica answered it successfully (it holds ``model``)."""
        if not marked_load:
            replica.in_slots -= 1
        else:
            left = replica.pending.get(model, 0) - 1
            if left > 0:
                replica.pending[model] = left
            else:
                replica.pending.pop(model, None)
                if not ok:
                    # The load it marked failed: requests waiting for it may go elsewhere now.
                    self._notify(False)
                    return
        if ok and model:
            replica.learned[model] = now
        self._notify(True)

    def answered(self, replica: Replica, now: float) -> None:
        """``replica`` answered a request: it is alive, whatever its polls say."""
        replica.answered_at = now

    def answered_since(self, name: str, since: float) -> bool:
        replica = self._replicas.get(name)
        return replica is not None and replica.answered_at >= since

    def failed(self, replica: Replica, now: float) -> None:
        """A connection to ``replica`` failed: out of rotation until seen alive again."""
        if replica.down_at is None:
            replica.down_at = now

    def has_room(self, now: float, limit: int) -> bool:
        """Whether some usable replica has fewer than ``limit`` requests in flight."""
        return any(r.inflight < limit for r in self.usable(now))

    # -- internals ---------------------------------------------------------------------------

    def _changed_now(self) -> None:
        self._notify(False)

    def _notify(self, freed: bool) -> None:
        if self.listener is not None:
            self.listener(freed)

    def _refresh(self, now: float) -> None:
        self._next_refresh = now + _REFRESH_EVERY_S
        back = False
        expired_before = now - self.learned_max_age_s
        for replica in self._replicas.values():
            if replica.learned:
                for model in [m for m, t in replica.learned.items() if t <= expired_before]:
                    del replica.learned[model]
            if replica.down_at is not None and now - replica.down_at >= self.quarantine_s:
                replica.down_at = None
                back = True
        if back:
            self._notify(False)
