"""Autoscaling that knows the cache: the routers' load report, the scaling decision, and the
cache-aware choices (which replica leaves first, which models a new one pre-loads).

Pure: no I/O, and no clock of its own (the :class:`Autoscaler` is given one), so the operator,
local mode and the tests drive it alike. How the pieces fit:

1. Every router serves a :class:`LoadReport` at ``GET /v1/load`` (:data:`LOAD_PATH`): the
   requests it has at each replica, the requests it holds in its queue (at zero replicas,
   every request is there), and the request rate of each model over the last
   :data:`RATE_WINDOW_S`. Read it with :meth:`LoadReport.from_json`.
2. The scaler reads every router of the deployment each tick (about every
   :data:`DEFAULT_TICK_S`), adds their reports up with :func:`merge`, and feeds the sum to its
   :class:`Autoscaler` (``observe``), one per deployment, kept across ticks. ``decide(current)``
   gives the replica count to ask for and why (:class:`ScaleDecision`): ``current`` is the
   count the scaler asked for last (the replica Deployment's ``spec.replicas``), not how
   many are ready.
3. Scale-down keeps the cache: :func:`deletion_costs` gives each replica its
   ``controller.kubernetes.io/pod-deletion-cost`` (:data:`DELETION_COST_ANNOTATION`), so the
   ReplicaSet removes the coldest first; :func:`coldest_first` is the same order, for local
   mode. :func:`rehome` says which hot models live only on a leaving replica and where to load
   them first.
4. A new replica pre-loads the hottest models (:func:`hottest_models`): the scaler writes them
   with :func:`format_hot_models` to a file the replica reads at start, named by
   :data:`ENV_PRELOAD_FILE` (in pods, a ConfigMap key mounted as a file; in local mode a file
   local mode writes). The replica loads them, up to its capacity, before it reports ready.
"""

from __future__ import annotations

import json
import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from modelplex.wire.spec import Autoscaling

#: The router's endpoint serving its :class:`LoadReport` (JSON).
LOAD_PATH = "/v1/load"
#: The replica reads the models to pre-load (:func:`parse_hot_models`) from the file this names.
ENV_PRELOAD_FILE = "MODELPLEX_PRELOAD_FILE"
#: The key (and file name) of the hot-models list in its ConfigMap.
HOT_MODELS_KEY = "hot-models"
#: Kubernetes removes the pod with the lowest cost first when a ReplicaSet scales down.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: The routers count each model's requests over this window (``model_rates`` are per second).
RATE_WINDOW_S = 60.0
#: How often a scaler should read the routers and decide.
DEFAULT_TICK_S = 1.0
#: Ray Serve's default bound on waiting for a replica at zero is far shorter; cold starts here
#: (a pod scheduled, the image's Python started, a model loaded) take up to ~15 s.
DEFAULT_HOLD_AT_ZERO_S = 60.0
_INT32_MAX = 2**31 - 1


# -- the report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as one router sees it.

    ``ongoing``: the router's requests at the replica now (in its slots, or waiting there for a
    model's load). ``models``: the models it holds (loaded, as the router last learned).
    ``capacity``: how many models it holds at most (0: unknown)."""

    name: str
    ongoing: int = 0
    ready: bool = True
    models: tuple[str, ...] = ()
    capacity: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ongoing": self.ongoing, "ready": self.ready,
                "models": list(self.models), "capacity": self.capacity}


@dataclass(frozen=True)
class LoadReport:
    """What a router (or, merged, all of a deployment's routers) has to say about load.

    ``at``: wall-clock time (Unix seconds) the report was taken, to tell a stale one.
    ``queued``: requests waiting in the router for a replica slot: every replica full, or none
    ready (at zero replicas every request waits here: a scaler seeing ``queued > 0`` at zero
    starts a replica). ``model_rates``: requests per second per model over ``window_s``.
    """

    deployment: str
    at: float
    queued: int = 0
    replicas: tuple[ReplicaLoad, ...] = ()
    model_rates: Mapping[str, float] = field(default_factory=dict)
    window_s: float = RATE_WINDOW_S
    router: str = ""

    @property
    def ongoing(self) -> int:
        """All the requests the scaler counts: at the replicas and queued in the router."""
        return sum(r.ongoing for r in self.replicas) + self.queued

    def replica(self, name: str) -> ReplicaLoad | None:
        return next((r for r in self.replicas if r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "router": self.router,
            "at": self.at,
            "queued": self.queued,
            "ongoing": self.ongoing,
            "window_s": self.window_s,
            "replicas": [r.to_dict() for r in self.replicas],
            "model_rates": dict(sorted(self.model_rates.items())),
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: Any) -> LoadReport:
        """Raises ValueError naming the field when ``data`` is not a report."""
        if not isinstance(data, dict):
            raise ValueError(f"load report: must be an object (got {type(data).__name__})")
        try:
            replicas = tuple(
                ReplicaLoad(name=str(r["name"]), ongoing=_count(r.get("ongoing", 0), "ongoing"),
                            ready=bool(r.get("ready", True)), models=tuple(str(m) for m in r.get("models", ())),
                            capacity=_count(r.get("capacity", 0), "capacity"))
                for r in data.get("replicas", ())
            )
            rates = {str(model): float(rate) for model, rate in (data.get("model_rates") or {}).items()}
            return cls(deployment=str(data["deployment"]), at=float(data["at"]),
                       queued=_count(data.get("queued", 0), "queued"), replicas=replicas, model_rates=rates,
                       window_s=float(data.get("window_s", RATE_WINDOW_S)), router=str(data.get("router", "")))
        except KeyError as error:
            raise ValueError(f"load report: {error.args[0]}: required") from None
        except (TypeError, AttributeError) as error:
            raise ValueError(f"load report: malformed ({error})") from None

    @classmethod
    def from_json(cls, body: bytes | str) -> LoadReport:
        try:
            data = json.loads(body)
        except ValueError as error:
            raise ValueError(f"load report: not JSON ({error})") from None
        return cls.from_dict(data)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"load report: {name}: must be a count >= 0 (got {value!r})")
    return int(value)


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
    report and :meth:`decide` after it, both at about :data:`DEFAULT_TICK_S`.
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


def coldest_first(report: LoadReport, candidates: Iterable[str] | None = None) -> list[str]:
    """Replica names, the one to remove first first: the coldest cache, then the fewest
    ongoing requests, then the name (later names first: the newest, in local mode).
    ``candidates`` limits the answer to those names (replicas the report lacks count as cold)."""
    heat = replica_heat(report)
    names = list(heat) if candidates is None else list(candidates)

    def key(name: str) -> tuple:
        replica = report.replica(name)
        return (heat.get(name, 0.0), replica.ongoing if replica else 0, [-ord(c) for c in name])

    return sorted(names, key=key)


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


def format_hot_models(models: Iterable[str]) -> str:
    """The pre-load file's text: one model id a line, hottest first."""
    return "".join(f"{model}\n" for model in models)


def parse_hot_models(text: str) -> list[str]:
    """The model ids of a pre-load file (blank lines and ``#`` comments skipped, duplicates once)."""
    models = (line.strip() for line in text.splitlines())
    return list(dict.fromkeys(m for m in models if m and not m.startswith("#")))
