"""Autoscaling that knows the cache: the scaling decision, and the
cache-aware choices (which replica leaves first, which models a new one pre-loads).

Pure: no I/O, and no clock of its own (the :class:`Autoscaler` is given one), so the operator,
local mode and the tests drive it alike. How the pieces fit:

1. Every router serves a :class:`~modelplex.wire.load.LoadReport` at ``GET /v1/load`` (the
   contract is :mod:`modelplex.wire.load`): the requests it has at each replica, the requests
   it holds in its queue (at zero replicas, every request is there), and the request rate of
   each model over the last minute.
2. The scaler reads every router of the deployment each tick (about every
   :data:`TICK_S`), adds their reports up with :func:`merge`, and feeds the sum to its
   :class:`Autoscaler` (``observe``), one per deployment, kept across ticks. ``decide(current)``
   gives the replica count to ask for and why (:class:`ScaleDecision`): ``current`` is the
   count the scaler asked for last (the replica Deployment's ``spec.replicas``), not how
   many are ready.
3. Scale-down keeps the cache: :func:`deletion_costs` gives each replica its
   ``controller.kubernetes.io/pod-deletion-cost`` (:data:`DELETION_COST_ANNOTATION`), so the
   ReplicaSet removes the coldest first (:func:`leaving_replicas` is the same order, which
   local mode follows itself). :func:`cheap_moves` says which hot models live only on the
   leaving replicas and where to load them first; declared copies are pinned on the staying
   ones first.
4. A new replica pre-loads the hottest models (:func:`hottest_models`, as many as
   :func:`preload_count` says): the scaler writes them with
   :func:`modelplex.wire.load.format_hot_models` to a file the replica reads at start.

:func:`plan_round` is all of that for one round: both drivers (local mode,
``modelplex_launcher.local``; the operator, ``modelplex_operator.handlers.autoscale``) observe,
call it every :data:`TICK_S`, and carry out its :class:`RoundPlan`.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

from modelplex.wire.load import LoadReport, ReplicaLoad
from modelplex.wire.pins import place_pins
from modelplex.wire.spec import DEFAULT_MAX_MODELS_PER_REPLICA, Autoscaling

#: Kubernetes removes the pod with the lowest cost first when a ReplicaSet scales down.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
_INT32_MAX = 2**31 - 1

# -- the drivers' common settings: local mode and the operator run the same rounds ------------

#: Seconds between rounds, in both drivers. The decision's own windows (lookBack, delays) are in
#: seconds, so this sets only how soon a change is seen: a request held at zero waits this at
#: most before its replica starts. 2 s: each round of the operator lists a deployment's pods.
TICK_S = 2.0
#: A router's load report is read within this (all routers at once): a report is a small JSON
#: document, and a round never runs past its tick for a router that does not answer.
READ_TIMEOUT_S = 1.0
#: At most this many hot models are loaded elsewhere before a scale-down (each is one model load).
MAX_MOVES = 2
#: Each of those loads is waited for this long at most.
MOVE_TIMEOUT_S = 30.0
#: Declared copies pinned before a scale-down are waited for ``loadTimeoutSeconds`` + this.
PIN_MARGIN_S = 5.0
#: A new replica pre-loads at most this many hot models: each one delays its readiness (a
#: replica started for a request held at zero answers it only after them).
MAX_PRELOAD_MODELS = 4


# -- the report -------------------------------------------------------------------------------


def merge(reports: Iterable[LoadReport]) -> LoadReport:
    """The deployment's load: several routers' reports added up.

    Each router sees only its own requests, so ongoing requests add up per replica, as do
    the queues and the model rates; a replica's models and readiness are the union of what
    the routers saw. ``at`` is the oldest report's (the sum is as old as its oldest part)."""
    reports = list(reports)
    if not reports:
        raise ValueError("merge: no reports")
    by_name: dict[str, ReplicaLoad] = {}
    rates: Counter[str] = Counter()
    for report in reports:
        rates.update(report.model_rates)
        for replica in report.replicas:
            seen = by_name.get(replica.name)
            if seen is None:
                by_name[replica.name] = replica
                continue
            models = tuple(dict.fromkeys(seen.models + replica.models))
            by_name[replica.name] = ReplicaLoad(replica.name, seen.ongoing + replica.ongoing,
                                                seen.ready or replica.ready, models,
                                                max(seen.capacity, replica.capacity))
    return LoadReport(
        deployment=reports[0].deployment,
        at=min(r.at for r in reports),
        queued=sum(r.queued for r in reports),
        replicas=tuple(by_name[name] for name in sorted(by_name)),
        model_rates=dict(rates),
        window_s=max(r.window_s for r in reports),
        router=",".join(r.router for r in reports if r.router),
    )


# -- the decision -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleDecision:
    """What :meth:`Autoscaler.decide` wants: ``desired`` replicas (== ``current`` when nothing
    changes), why (a sentence for status and Events), and the inputs it used."""

    desired: int
    current: int
    reason: str
    #: Ongoing requests (replicas + router queues) averaged over lookBackPeriodSeconds.
    average_ongoing: float
    #: The requests queued in the routers in the latest report.
    queued: int
    at: float

    @property
    def changed(self) -> bool:
        return self.desired != self.current

    @property
    def direction(self) -> str:
        """``up``, ``down`` or ``none``."""
        if self.desired > self.current:
            return "up"
        return "down" if self.desired < self.current else "none"


@dataclass(frozen=True)
class _Sample:
    at: float
    ongoing: float
    queued: int


class Autoscaler:
    """Ray Serve's autoscaling decision for one deployment, fed samples over time.

    The load is the ongoing requests (replicas + router queues) averaged over
    ``lookBackPeriodSeconds``; each decision turns it into a wanted count,
    ``ceil(load / targetOngoingRequests)`` within [minReplicas, maxReplicas]. As in Ray Serve,
    more replicas must be wanted at every decision of the last ``upscaleDelaySeconds`` before
    the count goes up (to what is wanted now), and fewer at every decision of the last
    ``downscaleDelaySeconds`` before it goes down: to the *highest* count wanted over that
    window, as Kubernetes' HPA stabilization does, so a fall in load comes down in steps. A
    noisy signal, wanting more one moment and less the next, changes nothing. The exceptions:
    at 0 replicas a waiting request starts replicas at once (at least one, as many as the
    load wants), and the bounds apply at once.

    ``clock`` is monotonic seconds (the scaler's own); call :meth:`observe` with each (merged)
    report and :meth:`decide` after it, both at about :data:`TICK_S`.
    """

    def __init__(self, config: Autoscaling, clock: Callable[[], float]):
        self.config = config
        self.clock = clock
        self._samples: deque[_Sample] = deque()
        #: (time, wanted count) of each decision, for the delays' windows.
        self._wanted: deque[tuple[float, int]] = deque()
        self._since: float | None = None  # the first decision: the windows reach back to it at most

    def observe(self, ongoing: float, queued: int = 0) -> None:
        """A sample taken now: ``ongoing`` requests in all (replicas and queues), ``queued`` of
        them waiting in the routers."""
        self._samples.append(_Sample(self.clock(), float(ongoing), int(queued)))

    def observe_report(self, report: LoadReport) -> None:
        """:meth:`observe` a (merged) :class:`LoadReport`."""
        self.observe(report.ongoing, report.queued)

    def average_ongoing(self) -> float | None:
        """The ongoing requests averaged over the look-back window; None without a sample in it."""
        now = self.clock()
        self._forget(now)
        since = now - self.config.look_back_period_seconds
        recent = [s.ongoing for s in self._samples if s.at > since]
        return sum(recent) / len(recent) if recent else None

    def wanted(self, average_ongoing: float) -> int:
        """Replicas for an average load: ``ceil(load / target)`` within the bounds."""
        config = self.config
        count = math.ceil(average_ongoing / config.target_ongoing_requests - 1e-9) if average_ongoing > 0 else 0
        return max(config.min_replicas, min(config.max_replicas, count))

    def decide(self, current: int) -> ScaleDecision:
        """The replica count to ask for, given ``current`` (the count asked for last)."""
        config = self.config
        now = self.clock()
        if self._since is None:
            self._since = now
        average = self.average_ongoing()
        latest = self._samples[-1] if self._samples else None
        queued = latest.queued if latest else 0

        def decision(desired: int, reason: str) -> ScaleDecision:
            return ScaleDecision(desired, current, reason, round(average or 0.0, 3), queued, now)

        if current < config.min_replicas:
            return decision(config.min_replicas, f"below minReplicas ({config.min_replicas})")
        if current > config.max_replicas:
            return decision(config.max_replicas, f"above maxReplicas ({config.max_replicas})")
        if average is None:  # no word from the routers: no reason to change anything
            return decision(current, f"no load report in the last {config.look_back_period_seconds:g} s: "
                                     f"keeping {current}")
        wanted = self.wanted(average)
        self._wanted.append((now, wanted))
        if current == 0 and latest is not None and latest.ongoing > 0:
            held = latest.queued or int(latest.ongoing)
            return decision(max(1, wanted), f"{held} request(s) waiting at zero replicas")
        load = f"{average:.3g} ongoing requests on average over {config.look_back_period_seconds:g} s"
        up = self._settled(now, config.upscale_delay_seconds, min)
        if up is not None and up > current:
            return decision(wanted, f"{load}, target {config.target_ongoing_requests:g} per replica")
        down = self._settled(now, config.downscale_delay_seconds, max)
        if down is not None and down < current:
            if down == 0:
                return decision(0, f"idle for {config.downscale_delay_seconds:g} s")
            return decision(down, f"{load}, target {config.target_ongoing_requests:g} per replica, "
                                  f"for {config.downscale_delay_seconds:g} s")
        if wanted > current:
            return decision(current, f"{wanted} replicas wanted; waiting out upscaleDelaySeconds "
                                     f"({config.upscale_delay_seconds:g} s)")
        if wanted < current:
            return decision(current, f"{wanted} replica(s) wanted; waiting out downscaleDelaySeconds "
                                     f"({config.downscale_delay_seconds:g} s)")
        return decision(current, f"steady: {load}")

    def _settled(self, now: float, delay: float, pick: Callable[[Iterable[int]], int]) -> int | None:
        """``pick`` (min or max) of the counts wanted over the last ``delay`` seconds, or
        None while the decisions do not reach that far back yet."""
        if self._since is None or now - self._since < delay:
            return None
        start = now - delay
        return pick(count for at, count in self._wanted if at >= start)

    def _forget(self, now: float) -> None:
        config = self.config
        keep = max(config.upscale_delay_seconds, config.downscale_delay_seconds) + 1.0
        while self._wanted and self._wanted[0][0] < now - keep:
            self._wanted.popleft()
        while len(self._samples) > 1 and self._samples[0].at <= now - config.look_back_period_seconds:
            self._samples.popleft()


# -- the cache-aware choices ------------------------------------------------------------------


def _copies(report: LoadReport) -> Counter[str]:
    return Counter(model for replica in report.replicas for model in set(replica.models))


def replica_heat(report: LoadReport) -> dict[str, float]:
    """Requests per second each replica's cache serves: each of its models' rate, shared among
    the replicas holding a copy. A replica alone in holding a hot model is hot."""
    copies = _copies(report)
    return {
        replica.name: sum(report.model_rates.get(m, 0.0) / copies[m] for m in set(replica.models))
        for replica in report.replicas
    }


def deletion_costs(report: LoadReport) -> dict[str, int]:
    """Each replica's ``controller.kubernetes.io/pod-deletion-cost``: the requests per minute
    its cache serves (:func:`replica_heat`), so the coldest cache goes first on a scale-down.
    Kubernetes reads it as an int32 and breaks ties its own way."""
    return {name: min(_INT32_MAX, round(heat * 60)) for name, heat in replica_heat(report).items()}


def hottest_models(report: LoadReport, limit: int | None = None) -> list[str]:
    """The models a new replica should pre-load, hottest first: the most requests per second
    per copy (a model held nowhere counts as one copy). Models with no requests are left out."""
    copies = _copies(report)
    ranked = sorted(
        ((rate / max(1, copies[model]), rate, model) for model, rate in report.model_rates.items() if rate > 0),
        key=lambda item: (-item[0], -item[1], item[2]),
    )
    models = [model for _, _, model in ranked]
    return models if limit is None else models[:limit]


def rehome(report: LoadReport, leaving: str, *, min_rate: float = 0.0) -> list[tuple[str, str]]:
    """Before ``leaving`` goes: ``(model, replica)`` pairs, each a hot model (rate above
    ``min_rate``) that only ``leaving`` holds and the staying replica to load it on (one with
    room, the coldest; else the coldest). Hottest model first; empty when none stays."""
    staying = [r for r in report.replicas if r.name != leaving and r.ready]
    gone = report.replica(leaving)
    if not staying or gone is None:
        return []
    copies = _copies(report)
    heat = replica_heat(report)
    held = {r.name: len(set(r.models)) for r in staying}
    moves = []
    only_here = [m for m in gone.models if copies[m] == 1 and report.model_rates.get(m, 0.0) > min_rate]
    for model in sorted(only_here, key=lambda m: (-report.model_rates[m], m)):
        room = [r for r in staying if r.capacity == 0 or held[r.name] < r.capacity]
        target = min(room or staying, key=lambda r: (heat.get(r.name, 0.0), held[r.name], r.name))
        held[target.name] += 1
        moves.append((model, target.name))
    return moves


def cheap_moves(report: LoadReport, leaving: Iterable[str], limit: int = MAX_MOVES, *,
                targets: Iterable[str] | None = None, skip: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(model, replica)``: the hot models only leaving replicas hold, each to load on a staying
    replica with room for it (never one that would evict to take it), hottest first, at most
    ``limit``. What is not cheap is left to the router: it loads a model where it lands.
    ``targets``: the replicas that may take one (default: every staying one); ``skip``: models
    taken care of otherwise (declared copies, pinned)."""
    gone = set(leaving)
    allowed = None if targets is None else set(targets)
    skipped = set(skip)
    room = {r.name: (r.capacity - len(set(r.models)) if r.capacity else 1)
            for r in report.replicas if r.name not in gone and (allowed is None or r.name in allowed)}
    candidates: list[tuple[str, str]] = []
    for name in sorted(gone):
        # Copies on the other leaving replicas go too: they count for nothing.
        view = replace(report, replicas=tuple(r for r in report.replicas if r.name == name or r.name not in gone))
        candidates.extend(move for move in rehome(view, name) if move[0] not in skipped)
    # The hottest first, whichever replica leaves with it: the room goes to them.
    candidates.sort(key=lambda move: (-report.model_rates.get(move[0], 0.0), move[0]))
    moves: list[tuple[str, str]] = []
    for model, target in candidates:
        if len(moves) < limit and room.get(target, 0) > 0:
            room[target] -= 1
            moves.append((model, target))
    return moves


def preload_count(report: LoadReport | None, max_models_per_replica: int | None) -> int:
    """How many hot models a new replica pre-loads, the one rule of both drivers:
    ``min(capacity, MAX_PRELOAD_MODELS)``, the capacity being a replica's model capacity as the
    routers report it (the handler's ``@multiplexed`` or the spec's), else the spec's
    ``maxModelsPerReplica``, else Ray's default (:data:`DEFAULT_MAX_MODELS_PER_REPLICA`)."""
    reported = max((r.capacity for r in report.replicas), default=0) if report is not None else 0
    capacity = reported or max_models_per_replica or DEFAULT_MAX_MODELS_PER_REPLICA
    return max(0, min(capacity, MAX_PRELOAD_MODELS))


# -- one round --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaState:
    """A live replica as its driver sees it: a pod (``cost``: its pod-deletion-cost now, if
    any), or a local process."""

    name: str
    ready: bool = False
    cost: int | None = None


@dataclass(frozen=True)
class Observed:
    """What a driver saw at the start of a round.

    ``reports``: the load reports of the routers that answered, of ``routers`` asked.
    ``current``: the replica count asked for last. ``replicas``: the live replicas.
    ``declared``: ``spec.models`` ``minCopies`` (model id -> copies to keep).
    ``max_models_per_replica``: the spec's, if set. ``hot``: the pre-load list written last
    (None: not known, e.g. after a restart)."""

    reports: Sequence[LoadReport]
    routers: int
    current: int
    replicas: Sequence[ReplicaState] = ()
    declared: Mapping[str, int] = field(default_factory=dict)
    max_models_per_replica: int | None = None
    hot: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RoundPlan:
    """What a round decided; the driver carries it out in this order: write ``costs`` (pods),
    before a scale-down load ``moves`` and pin ``pins`` (and wait for them), change the count
    to ``decision.desired`` (removing ``leaving``), write ``hot_models`` when not None.

    ``decision`` is None when no router answered: nothing changes (``message`` says why)."""

    decision: ScaleDecision | None
    report: LoadReport | None
    heard: str
    message: str
    #: Each live replica's pod-deletion-cost: its cache's heat (0: no router knows it yet).
    costs: dict[str, int] = field(default_factory=dict)
    #: On a scale-down: the replicas that go (not ready first, then the coldest).
    leaving: tuple[str, ...] = ()
    #: On a scale-down: ``(model, replica)`` hot models only leaving replicas hold, to load first.
    moves: tuple[tuple[str, str], ...] = ()
    #: On a scale-down: declared models to pin on each staying replica first (``{replica: ids}``).
    pins: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: How many hot models a new replica pre-loads (:func:`preload_count`).
    preload: int = 0
    #: The pre-load list to write now; None: keep what is written (unchanged, or nothing hot:
    #: an idle pool keeps the models that were hot last).
    hot_models: tuple[str, ...] | None = None
    #: The cost each leaving replica was picked by (the one it carries, where replicas carry costs).
    leaving_costs: dict[str, int] = field(default_factory=dict)


def leaving_replicas(replicas: Iterable[ReplicaState], costs: Mapping[str, int], count: int,
                     report: LoadReport | None = None) -> list[str]:
    """The ``count`` replicas a scale-down removes, in the ReplicaSet's order: not ready first,
    then the lowest cost, then the fewest ongoing requests, then the last name (the newest, in
    local mode; a pod's ReplicaSet breaks that tie its own way)."""
    ranked = sorted(replicas, key=lambda r: (r.ready, *_removal_rank(report, r.name, costs.get(r.name, 0))))
    return [replica.name for replica in ranked[:max(count, 0)]]


def _removal_rank(report: LoadReport | None, name: str, cost: int) -> tuple[int, int, list[int]]:
    """Among equally ready replicas, the one a scale-down removes first: the lowest cost, then
    the fewest ongoing requests, then the last name."""
    replica = report.replica(name) if report is not None else None
    return cost, replica.ongoing if replica is not None else 0, [-ord(c) for c in name]


def distinct_costs(costs: Mapping[str, int], report: LoadReport | None = None) -> dict[str, int]:
    """``costs`` with ties broken upwards (one apart), in the order :func:`leaving_replicas`
    removes by: a ReplicaSet removes the lower of two equal costs its own way, so no two pods
    are left equal for it to choose between."""
    out: dict[str, int] = {}
    floor = None
    for name in sorted(costs, key=lambda n: _removal_rank(report, n, costs.get(n, 0))):
        cost = costs[name] if floor is None else max(costs[name], floor + 1)
        out[name] = floor = min(_INT32_MAX, cost)
    return {name: out[name] for name in costs}


def _tied_at_the_cut(replicas: Sequence[ReplicaState], ranking: Mapping[str, int], count: int) -> bool:
    """Whether the last replica a scale-down of ``count`` removes and the first that stays rank
    the same for a ReplicaSet (both ready or not, the same cost): which goes is then its pick."""
    ranked = sorted(replicas, key=lambda r: (r.ready, ranking.get(r.name, 0)))
    if not 0 < count < len(ranked):
        return False
    last, first = ranked[count - 1], ranked[count]
    return (last.ready, ranking.get(last.name, 0)) == (first.ready, ranking.get(first.name, 0))


def plan_round(autoscaler: Autoscaler, observed: Observed) -> RoundPlan:
    """One autoscaling round, for local mode and the operator alike: the reports added up and
    fed to ``autoscaler`` (its state across rounds, and its clock), the count to ask for, the
    deletion costs, what to load and pin before a scale-down, and the hot models to list."""
    heard = f"{len(observed.reports)}/{observed.routers}"
    current = observed.current
    if not observed.reports:
        why = (f"no load report from the routers ({heard} answered): keeping {current} replicas"
               if observed.routers else f"no router runs yet: keeping {current} replicas")
        return RoundPlan(None, None, heard, why)
    report = merge(observed.reports)
    autoscaler.observe_report(report)
    decision = autoscaler.decide(current)
    heat = deletion_costs(report)
    costs = distinct_costs({replica.name: int(heat.get(replica.name, 0)) for replica in observed.replicas}, report)
    leaving: list[str] = []
    ranking: Mapping[str, int] = costs
    moves: list[tuple[str, str]] = []
    pins: dict[str, tuple[str, ...]] = {}
    if decision.direction == "down":
        # A ReplicaSet removes pods by the pod-deletion-costs they carry (an earlier round's), not
        # by those this round works out: where the replicas carry costs, the pick follows them
        # (a pod without one reads 0, as the ReplicaSet reads it), so the pods named are the
        # pods that go.
        carried = any(replica.cost is not None for replica in observed.replicas)
        ranking = {replica.name: replica.cost or 0 for replica in observed.replicas} if carried else costs
        if carried and _tied_at_the_cut(observed.replicas, ranking, current - decision.desired):
            # The ReplicaSet breaks a tie its own way (how long each pod has been ready): this
            # round writes distinct costs instead, and the next one removes by them.
            decision = replace(decision, desired=current,
                               reason=f"{decision.reason}; waiting a round for distinct pod-deletion-costs")
    if decision.direction == "down":
        leaving = leaving_replicas(observed.replicas, ranking, current - decision.desired, report)
        staying = {r.name for r in observed.replicas if r.ready and r.name not in leaving}
        if observed.declared and staying:
            capacity = {r.name: r.capacity for r in report.replicas}
            placement = place_pins(observed.declared, {name: capacity.get(name, 0) for name in sorted(staying)})
            pins = {name: models for name, models in placement.replicas.items() if models}
        moves = cheap_moves(report, leaving, targets=staying, skip=observed.declared)
    count = preload_count(report, observed.max_models_per_replica)
    hot = tuple(hottest_models(report, count))
    return RoundPlan(decision, report, heard, decision.reason, costs, tuple(leaving), tuple(moves), pins, count,
                     hot if hot and hot != observed.hot else None, {name: ranking.get(name, 0) for name in leaving})
