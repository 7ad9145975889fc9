"""``spec.userConfig`` on the live replicas: Ray's ``reconfigure``, with no rollout.

The pod template's hash leaves ``userConfig`` out (:func:`modelplex_operator.builders.spec_hash`),
so a change of it alone rolls no pod: a new pod reads it from the spec ConfigMap and applies it
before it is ready, and the operator sends it to every ready replica pod
(``POST /v1/user-config``, :mod:`modelplex.wire.user_config`) whose handler has not applied it,
each time the status keeper refreshes the resource (a spec change or a pod's readiness
changing pokes it). A pod is sent a value again when it becomes ready again (its container may
have restarted with an older ConfigMap file); a replica answers a value it applied without
calling ``reconfigure`` twice, so a repeat (the operator restarted) costs one request.

The status says which value each ready replica applied (``status.userConfig``), the
``UserConfigApplied`` condition whether all did and, when not, why; a Normal Event
``UserConfigApplied`` says when a new value is on every ready replica, a Warning
``ReconfigureFailed`` names a replica whose ``reconfigure`` raised. Such a replica is not sent
that value again (it keeps serving with the value it had; nothing restarts it): a new value, or
the pod becoming ready again, is. A replica that did not answer is asked again after
:data:`RETRY_S`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from modelplex.wire.names import REPLICA_PORT
from modelplex.wire.user_config import config_hash
from modelplex_operator.pods import PodCallError, PodClient, ReplicaRefused
from modelplex_operator.status import Key, PodView

#: The condition: True while every ready replica applied the current ``spec.userConfig``.
CONDITION = "UserConfigApplied"
#: A handler's ``reconfigure`` may load things: bounded generously, as Ray's is not at all.
RECONFIGURE_TIMEOUT_S = 60.0
#: Before asking a replica again that gave no answer.
RETRY_S = 5.0
#: Replicas sent a value at once.
MAX_CONCURRENT_SENDS = 8
#: Replicas a condition's message names (the others are counted).
NAMED_IN_MESSAGE = 3
#: Replicas ``status.userConfig.replicas`` lists (``applied`` counts them all), as ``status.models`` is bounded.
MAX_LISTED_REPLICAS = 50

Event = tuple[str, str, str]


@dataclass
class PodState:
    """What the operator knows of one replica pod's userConfig."""

    applied: str | None = None  # the hash of what its handler applied, as it answered
    tried: str | None = None  # the hash last sent
    error: str = ""  # why the last send failed ("" after a good one)
    refused: bool = False  # the replica answered an error: not sent that value again
    retry_at: float = 0.0


@dataclass(frozen=True)
class Sync:
    """What one round found: the status block, the condition (both None: no userConfig), Events
    to post, and when a send that failed is due again (None: none is)."""

    status: dict[str, Any] | None = None
    condition: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    retry_in: float | None = None


def serving(pods: Iterable[PodView]) -> list[PodView]:
    """The pods that get a value: ready, not going away, with an address."""
    return [pod for pod in pods if pod.ready and not pod.deleting and pod.ip]


def due(known: Mapping[str, PodState], wanted: str, pods: Iterable[PodView], now: float) -> list[PodView]:
    """The ready pods to send the value ``wanted`` (its hash) to now: those that have not applied
    it, unless they refused it, or did not answer and their pause is not over."""
    result = []
    for pod in serving(pods):
        state = known.get(pod.name)
        if state is None or state.tried != wanted:
            result.append(pod)
        elif state.applied != wanted and not state.refused and state.retry_at <= now:
            result.append(pod)
    return result


def _named(failures: Mapping[str, str]) -> str:
    names = sorted(failures)
    message = "; ".join(f"{name}: {failures[name]}" for name in names[:NAMED_IN_MESSAGE])
    return message + (f"; and {len(names) - NAMED_IN_MESSAGE} more" if len(names) > NAMED_IN_MESSAGE else "")


def summarize(known: Mapping[str, PodState], wanted: str, pods: Iterable[PodView],
              generation: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``status.userConfig`` and the ``UserConfigApplied`` condition for the ready ``pods``."""
    ready = serving(pods)
    states = {pod.name: known.get(pod.name) or PodState() for pod in ready}
    applied = [name for name, state in states.items() if state.applied == wanted]
    status = {"hash": wanted, "applied": len(applied),
              # A list, not a map: the status is a merge patch, which would keep a gone pod's key.
              "replicas": [{"name": name, "hash": state.applied} for name, state in sorted(states.items())
                           if state.applied][:MAX_LISTED_REPLICAS]}
    refused = {name: state.error for name, state in states.items()
               if state.tried == wanted and state.refused and state.applied != wanted}
    unanswered = {name: state.error for name, state in states.items()
                  if state.tried == wanted and state.error and not state.refused and state.applied != wanted}
    counts = f"{len(applied)}/{len(ready)} ready replicas applied userConfig {wanted}"
    if refused:
        condition = _condition(False, "ReconfigureFailed", f"{counts}; reconfigure raised on {_named(refused)}",
                               generation)
    elif unanswered:
        condition = _condition(False, "ReplicaUnreachable", f"{counts}; no answer from {_named(unanswered)}",
                               generation)
    elif len(applied) < len(ready):
        condition = _condition(False, "Applying", counts, generation)
    else:
        condition = _condition(True, "Applied", counts if ready else
                               f"no ready replica; new replicas start with userConfig {wanted}", generation)
    return status, condition


def _condition(true: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": CONDITION, "status": "True" if true else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


class UserConfigs:
    """Sends each resource's ``spec.userConfig`` to its ready replicas (one per operator process).

    ``clock``: monotonic seconds, for the pauses before asking again; ``port``: the replicas' API port."""

    def __init__(self, pods: PodClient, *, clock: Callable[[], float] = time.monotonic,
                 timeout_s: float = RECONFIGURE_TIMEOUT_S, port: int = REPLICA_PORT):
        self.pods = pods
        self.port = port
        self.clock = clock
        self.timeout_s = timeout_s
        self._known: dict[Key, dict[str, PodState]] = {}
        #: The value a live replica reconfigured with and no Event announced yet, per resource.
        self._unannounced: dict[Key, str] = {}

    def forget(self, key: Key) -> None:
        self._known.pop(key, None)
        self._unannounced.pop(key, None)

    async def sync(self, key: Key, config: Any, pods: Iterable[PodView], *, generation: int = 1) -> Sync:
        """Send ``config`` (``spec.userConfig``; None: there is none) to the ready ``pods`` that
        have not applied it."""
        if config is None:
            self.forget(key)
            return Sync()
        pods = list(pods)
        wanted = config_hash(config)
        ready = {pod.name for pod in serving(pods)}
        # A pod that is not ready is sent the value again once it is (it may have restarted).
        known = {name: state for name, state in self._known.get(key, {}).items() if name in ready}
        self._known[key] = known
        events: list[Event] = []
        limit = asyncio.Semaphore(MAX_CONCURRENT_SENDS)

        async def send(pod: PodView) -> None:
            state = known.setdefault(pod.name, PodState())
            fresh = state.tried != wanted
            state.tried = wanted
            try:
                async with limit:
                    state.applied, live = await self.pods.reconfigure(key, pod.ip, config, timeout_s=self.timeout_s,
                                                                      port=self.port)
                state.error, state.refused = "", False
                if live and state.applied == wanted:  # its reconfigure ran (not a pod that started with it)
                    self._unannounced[key] = wanted
            except ReplicaRefused as error:
                state.error, state.refused = str(error), True
                if fresh:
                    events.append(("Warning", "ReconfigureFailed",
                                   f"replica {pod.name}: userConfig {wanted} not applied ({error}); it serves on "
                                   "with the userConfig it had"))
            except PodCallError as error:
                state.error, state.refused, state.retry_at = str(error), False, self.clock() + RETRY_S

        await asyncio.gather(*(send(pod) for pod in due(known, wanted, pods, self.clock())))
        status, condition = summarize(known, wanted, pods, generation)
        if ready and status["applied"] == len(ready) and self._unannounced.get(key) == wanted:
            del self._unannounced[key]
            events.append(("Normal", "UserConfigApplied",
                           f"userConfig {wanted} applied on {len(ready)} ready replica(s) (reconfigure; no restart)"))
        waiting = [state.retry_at for state in known.values()
                   if state.tried == wanted and state.error and not state.refused]
        retry_in = max(0.0, min(waiting) - self.clock()) if waiting else None
        return Sync(status=status, condition=condition, events=events, retry_in=retry_in)
