"""One replica as the router knows it: what the replica reported, and the router's own bookkeeping.

The routing table (:mod:`modelplex_router.table`) is the only writer of these records; the
scheduler, the policy, the proxy and the reports only read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelplex.wire.loaded import LoadedModels, LoadedSummary
from modelplex_router.policy import ring_point

_EMPTY = LoadedModels()


@dataclass(frozen=True, slots=True)
class Held:
    """What a replica reported holding: always the fixed-size summary, and the full document
    when the source read it (a poll, a fetch). ``document`` is ``None`` when the source saw only
    the summary (a pod annotation): the summary's version then says whether there is a newer
    document to fetch."""

    summary: LoadedSummary
    document: LoadedModels | None = None

    @classmethod
    def of(cls, document: LoadedModels) -> Held:
        """A full document (its summary with it)."""
        return cls(document.summary(), document)


@dataclass(eq=False, slots=True)
class Replica:
    """A replica in the table: its address and readiness, the last document it reported, and
    what the router's own traffic says about it."""

    name: str
    url: str
    ready: bool = False
    #: The last full document read from it (a poll, a fetch); an empty one until then.
    document: LoadedModels = _EMPTY
    capacity: int = 0  # models, from the latest summary; 0: unknown
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
    #: The last summary header its answers carried and that header's version: most answers
    #: repeat the last one, so each distinct header is parsed once.
    heard_header: str = ""
    heard_version: int = 0
    #: The document's models and loads as sets, for the policy's lookups (derived from ``document``).
    models: frozenset[str] = field(init=False)
    reported_loading: frozenset[str] = field(init=False)
    #: The table's index of this replica (kept by :class:`modelplex_router.table.RoutingTable`):
    #: its point on the hash ring, the models it is filed under as a holder, and the tier (model
    #: count) it is filed in, ``None`` while it is not ready or not in the table.
    point: int = field(init=False)
    indexed: frozenset[str] = field(init=False, default=frozenset())
    tier: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.models = frozenset(self.document.models)
        self.reported_loading = frozenset(self.document.loading)
        self.point = ring_point(self.name)

    @property
    def version(self) -> int:
        """The version of the document the table holds."""
        return self.document.version

    @property
    def inflight(self) -> int:
        """Requests in the replica's slots (``maxOngoingRequests``): those sent for a loaded
        model, and those that waited for a load that has finished since."""
        if not self.pending:
            return self.in_slots
        return self.in_slots + sum(count for model, count in self.pending.items() if self.loaded(model))

    @property
    def stale(self) -> bool:
        """A summary announced a newer document than the one held."""
        return self.latest_version > self.document.version

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

    def held(self) -> frozenset[str]:
        """Every model it holds or loads (what :meth:`holds` answers yes for)."""
        held = self.models
        if self.learned:
            held = held.union(self.learned)
        if self.pending:
            held = held.union(self.pending)
        if self.reported_loading:
            held = held.union(self.reported_loading)
        return held

    def all_models(self) -> set[str]:
        return set(self.models).union(self.learned)

    def all_loading(self) -> set[str]:
        return set(self.pending).union(self.reported_loading).difference(self.models, self.learned)

    @property
    def model_count(self) -> int:
        count = len(self.held())
        # The replica evicts past its capacity; count at most that so that full replicas tie
        # (and the stable hash decides) instead of the one we happen to know less about winning.
        return min(count, self.capacity) if self.capacity > 0 else count

    def to_dict(self) -> dict[str, Any]:
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
