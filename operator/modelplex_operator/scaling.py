"""The operator's side of autoscaling, as pure functions (the decision itself is
:class:`modelplex.autoscaling.Autoscaler`; the I/O is :mod:`modelplex_operator.handlers.autoscale`).

- :func:`autoscaling_status`: the ``status.autoscaling`` block (the decision and its inputs)
  and the ``Autoscaling`` condition;
- :func:`cost_patches`: which replica pods need their ``controller.kubernetes.io/pod-deletion-cost``
  rewritten, so the ReplicaSet removes the coldest cache first without a patch per pod per round;
- :func:`leaving_pods`: the pods a scale-down will remove (the lowest costs, as the ReplicaSet
  picks them), and :func:`cheap_moves`: the hot models only they hold, to load elsewhere first;
- :func:`scale_event`: the Event of a change, with its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from modelplex.autoscaling import DELETION_COST_ANNOTATION, LoadReport, ScaleDecision, rehome

CONDITION = "Autoscaling"
#: At most this many models are loaded elsewhere before a scale-down (each is one model load).
MAX_MOVES = 2
#: A cost is rewritten when it moved by more than this share (or 5 requests a minute), or the
#: pods' order changed: the order is what the ReplicaSet reads.
COST_TOLERANCE = 0.2
_COST_SLACK = 5


@dataclass(frozen=True)
class ReplicaPod:
    """A live replica pod as the autoscaler needs it."""

    name: str
    ip: str = ""
    ready: bool = False
    cost: int | None = None  # its pod-deletion-cost annotation now, if any


def parse_cost(raw: str | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def replica_pod(pod: Mapping[str, Any]) -> ReplicaPod:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    return ReplicaPod(meta.get("name", ""), status.get("podIP") or "", ready,
                      parse_cost((meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION)))


def pod_costs(pods: Iterable[ReplicaPod], costs: Mapping[str, int]) -> dict[str, int]:
    """The cost each live pod should carry: its cache's heat; a pod no router knows yet holds
    nothing anyone asked for (0)."""
    return {pod.name: int(costs.get(pod.name, 0)) for pod in pods}


def cost_patches(pods: Iterable[ReplicaPod], wanted: Mapping[str, int]) -> dict[str, str]:
    """``{pod: cost}`` for the pods whose annotation must be rewritten: missing, far from the
    wanted cost, or every changed one when the order by cost would differ."""
    pods = [pod for pod in pods if pod.name in wanted]
    changed = {pod.name for pod in pods if pod.cost != wanted[pod.name]}

    def order(cost_of) -> list[str]:
        return [pod.name for pod in sorted(pods, key=lambda p: (cost_of(p), p.name))]

    if order(lambda p: p.cost if p.cost is not None else -1) != order(lambda p: wanted[p.name]):
        due = changed
    else:
        due = {pod.name for pod in pods
               if pod.cost is None or abs(wanted[pod.name] - pod.cost) > max(_COST_SLACK, COST_TOLERANCE * abs(pod.cost))}
    return {name: str(wanted[name]) for name in sorted(due)}


def leaving_pods(pods: Iterable[ReplicaPod], wanted: Mapping[str, int], count: int) -> list[str]:
    """The ``count`` pods a scale-down removes: the ReplicaSet takes pods not ready first,
    then the lowest pod-deletion-cost (ties: the name, a stand-in for its own tie-breaks)."""
    ranked = sorted(pods, key=lambda p: (p.ready, wanted.get(p.name, 0), p.name))
    return [pod.name for pod in ranked[:max(count, 0)]]


def cheap_moves(report: LoadReport, leaving: Iterable[str], limit: int = MAX_MOVES) -> list[tuple[str, str]]:
    """``(model, replica)``: the hot models only leaving pods hold, each to load on a staying
    replica with room for it (never one that would evict to take it), hottest first, at most
    ``limit``. What is not cheap is left to the router: it loads a model where it lands."""
    gone = set(leaving)
    room = {r.name: (r.capacity - len(set(r.models)) if r.capacity else 1)
            for r in report.replicas if r.name not in gone}
    moves: list[tuple[str, str]] = []
    for name in sorted(gone):
        # Copies on the other leaving pods go too: they count for nothing.
        view = replace(report, replicas=tuple(r for r in report.replicas if r.name == name or r.name not in gone))
        for model, target in rehome(view, name):
            if room.get(target, 0) > 0:
                room[target] -= 1
                moves.append((model, target))
    moves.sort(key=lambda move: (-report.model_rates.get(move[0], 0.0), move[0]))
    return moves[:limit]


def scale_event(decision: ScaleDecision, routers: str) -> tuple[str, str, str]:
    """``(type, reason, message)`` of a replica count change."""
    reason = "ScaledUp" if decision.direction == "up" else "ScaledDown"
    message = (f"replicas {decision.current} -> {decision.desired}: {decision.reason} "
               f"(ongoing {decision.average_ongoing:g} on average, {decision.queued} queued; "
               f"load reports from {routers} routers)")
    return "Normal", reason, message


@dataclass(frozen=True)
class LastScale:
    time: str
    reason: str


def autoscaling_status(
    *,
    desired: int,
    current: int,
    average_ongoing: float,
    queued: int,
    routers: str,
    replicas: Iterable[tuple[str, int, int]],
    last_scale: LastScale | None,
    message: str,
) -> dict[str, Any]:
    """The ``status.autoscaling`` block; ``replicas``: ``(pod, ongoing, deletion cost)``."""
    block: dict[str, Any] = {
        "desiredReplicas": desired,
        "currentReplicas": current,
        "ongoingRequests": round(average_ongoing, 1),
        "queuedRequests": queued,
        "routers": routers,
        "replicas": [{"name": name, "ongoingRequests": ongoing, "deletionCost": cost}
                     for name, ongoing, cost in sorted(replicas)],
        "message": message,
    }
    if last_scale is not None:
        block["lastScaleTime"] = last_scale.time
        block["lastScaleReason"] = last_scale.reason
    return block


def autoscaling_condition(healthy: bool, reason: str, message: str, generation: int,
                          previous: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """The ``Autoscaling`` condition: True while the autoscaler reads the load and acts on it."""
    status = "True" if healthy else "False"
    since = (previous or {}).get("lastTransitionTime") if (previous or {}).get("status") == status else None
    return {"type": CONDITION, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since or now}
