"""The operator's own side of autoscaling, as pure functions: what is Kubernetes' alone. The
round itself (the decision, costs, who leaves, moves, pins, hot models) is
:func:`modelplex.autoscaling.plan_round`, which local mode runs too; the I/O is
:mod:`modelplex_operator.handlers.autoscale`.

- :func:`replica_pod`: a replica pod as the round observes it (:meth:`ReplicaPod.state`);
- :func:`autoscaling_status`: the ``status.autoscaling`` block (the decision and its inputs)
  and the ``Autoscaling`` condition;
- :func:`cost_patches`: which replica pods need their ``controller.kubernetes.io/pod-deletion-cost``
  rewritten, so the ReplicaSet removes the coldest cache first without a patch per pod per round;
- :func:`scale_event`: the Event of a change, with its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from modelplex.autoscaling import DELETION_COST_ANNOTATION, ReplicaState, ScaleDecision

CONDITION = "Autoscaling"
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

    def state(self) -> ReplicaState:
        """The pod as :func:`modelplex.autoscaling.plan_round` observes it."""
        return ReplicaState(self.name, self.ready, self.cost)


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


def cost_patches(pods: Iterable[ReplicaPod], wanted: Mapping[str, int]) -> dict[str, str]:
    """``{pod: cost}`` for the pods whose annotation must be rewritten: missing, far from the
    wanted cost, or every changed one when the order by cost would differ or two pods carry the
    same cost."""
    pods = [pod for pod in pods if pod.name in wanted]
    changed = {pod.name for pod in pods if pod.cost != wanted[pod.name]}

    def order(cost_of) -> list[str]:
        return [pod.name for pod in sorted(pods, key=lambda p: (cost_of(p), p.name))]

    carried = [pod.cost for pod in pods]
    if (order(lambda p: p.cost if p.cost is not None else -1) != order(lambda p: wanted[p.name])
            or len(set(carried)) < len(carried)):  # a tie the ReplicaSet would break its own way
        due = changed
    else:
        due = {pod.name for pod in pods
               if pod.cost is None or abs(wanted[pod.name] - pod.cost) > max(_COST_SLACK, COST_TOLERANCE * abs(pod.cost))}
    return {name: str(wanted[name]) for name in sorted(due)}


def scale_event(decision: ScaleDecision, routers: str, leaving: Mapping[str, int] | None = None
                ) -> tuple[str, str, str]:
    """``(type, reason, message)`` of a replica count change; a scale-down names the pods it
    expects to go (``leaving``: name -> pod-deletion-cost, the coldest caches)."""
    reason = "ScaledUp" if decision.direction == "up" else "ScaledDown"
    message = (f"replicas {decision.current} -> {decision.desired}: {decision.reason} "
               f"(ongoing {decision.average_ongoing:g} on average, {decision.queued} queued; "
               f"load reports from {routers} routers)")
    if leaving:
        coldest = ", ".join(f"{pod} (cost {cost})" for pod, cost in leaving.items())
        message += f"; the coldest caches go: {coldest}"
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
