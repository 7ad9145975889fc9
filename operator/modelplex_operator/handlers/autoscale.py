"""The operator's autoscaling driver: every :data:`~modelplex.autoscaling.TICK_S`, for each
MultiplexedDeployment with ``spec.autoscaling``, observe, compute the round, and carry it out.

The round itself is :func:`modelplex.autoscaling.plan_round`, the one local mode runs too. What
this module does for one resource (:meth:`AutoscaleLoop.round`):

1. observe: list the deployment's pods; read ``GET /v1/load`` of every running router pod (all
   at once, each within :data:`~modelplex.autoscaling.READ_TIMEOUT_S`, through the operator's
   pod client); the replica pods; the count asked for last; the declared copies;
2. call the round with that and the resource's :class:`~modelplex.autoscaling.Autoscaler` (kept
   across rounds);
3. carry it out: keep each replica pod's ``controller.kubernetes.io/pod-deletion-cost``
   current; before a scale-down load the round's hot-model moves and pin its declared copies on
   the staying pods (and wait for them); write the replica Deployment's count (scale
   subresource) and post a ScaledUp/ScaledDown Event; keep ConfigMap ``N-hot-models`` current
   (the models a new replica pre-loads);
4. hand ``status.autoscaling`` and the ``Autoscaling`` condition to the status keeper (the
   context keeps them; ``on_status`` pokes the keeper).

Failures are tolerated: with no load report the replica count stays as it is (the condition
says why, the log too), and the next round tries again.

This is an asyncio task of the operator's own, not a kopf timer: kopf puts a finalizer on every
resource a timer watches, and this operator adds none (deleting a resource must not need it).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from modelplex.autoscaling import (MOVE_TIMEOUT_S, PIN_MARGIN_S, READ_TIMEOUT_S, TICK_S, Autoscaler, Observed,
                                   RoundPlan, ScaleDecision, plan_round)
from modelplex.wire.load import LoadReport
from modelplex.wire.names import LABEL_DEPLOYMENT, LABEL_ROLE, ROLE_REPLICA, ROLE_ROUTER
from modelplex.wire.spec import Autoscaling, Deployment, SpecError
from modelplex_operator import builders, scaling
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.pinned import prewarm
from modelplex_operator.handlers.reconcile import post
from modelplex_operator.kube import KubeError
from modelplex_operator.pods import PodCallError
from modelplex_operator.status import Key
from modelplex_operator.validation import validate

log = logging.getLogger("modelplex.operator.autoscale")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ScaleState:
    """What the autoscaler keeps of one resource between rounds."""

    autoscaler: Autoscaler
    config: Autoscaling
    uid: str
    last_scale: scaling.LastScale | None = None
    hot: tuple[str, ...] | None = None  # the hot-models list written last (None: not yet)
    condition: dict[str, Any] | None = None
    failing: bool = False


class AutoscaleLoop:
    def __init__(
        self,
        ctx: OperatorContext,
        *,
        tick_s: float = TICK_S,
        fetch_timeout_s: float = READ_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = utc_now,
        on_status: Callable[[Key], None] = lambda key: None,
    ):
        """``on_status(key)`` is called when a resource's autoscaling status changed (the
        status keeper's ``poke``). Calls to pods go through ``ctx.pods``."""
        self.ctx, self.on_status = ctx, on_status
        self.tick_s, self.fetch_timeout_s = tick_s, fetch_timeout_s
        self.clock, self.wall = clock, wall
        self.states: dict[Key, ScaleState] = {}
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ the task

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="modelplex-autoscaler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
                pass
            self._task = None

    @property
    def alive(self) -> bool:
        return self._task is None or not self._task.done()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            await self.round_all()

    async def round_all(self) -> None:
        """One round for every autoscaled resource the operator sees."""
        indexes = self.ctx.indexes
        if indexes is None:
            return
        seen = set()
        for key in indexes.resource_keys():
            view = indexes.resource(key)
            if view is None or (view.get("metadata") or {}).get("deletionTimestamp"):
                continue
            if (view.get("spec") or {}).get("autoscaling") is None:
                continue
            seen.add(key)
            try:
                await self.round(key, view)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - one resource's trouble stops no other
                log.warning("autoscaling %s/%s: round failed: %s", *key, error)
        for key in set(self.states) - seen:  # deleted, or autoscaling turned off
            del self.states[key]
            self.ctx.scaled.pop(key, None)
            self.ctx.autoscaling.pop(key, None)

    # ------------------------------------------------------------------ one resource

    async def round(self, key: Key, view: dict[str, Any]) -> ScaleDecision | None:
        """Observe, plan, act for one resource; returns the decision (None: none could be made)."""
        try:
            deployment = validate(view)
        except SpecError:
            return None  # the reconcile handler reports it
        config = deployment.spec.autoscaling
        assert config is not None
        meta = view["metadata"]
        state = self.states.get(key)
        if state is None or state.config != config or state.uid != meta.get("uid"):
            state = self.states[key] = ScaleState(Autoscaler(config, self.clock), config, meta.get("uid") or "",
                                                  last_scale=state.last_scale if state else None)
        namespace, name = key
        pods = await self.ctx.kube.alist_pods(namespace, f"{LABEL_DEPLOYMENT}={name}")
        live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        routers = [p for p in live if _role(p) == ROLE_ROUTER and (p.get("status") or {}).get("podIP")]
        replicas = [scaling.replica_pod(p) for p in live if _role(p) == ROLE_REPLICA]
        current = self.ctx.autoscaled_replicas(key)
        if current is None:
            current = deployment.spec.starting_replicas
        plan = plan_round(state.autoscaler, Observed(
            reports=await self._read_reports(key, deployment, routers), routers=len(routers), current=current,
            replicas=[pod.state() for pod in replicas], declared=deployment.spec.pinned_models,
            max_models_per_replica=deployment.spec.multiplexing.max_models_per_replica, hot=state.hot))
        decision = plan.decision
        if decision is None:
            if not state.failing:
                log.warning("autoscaling %s/%s: %s", *key, plan.message)
            state.failing = True
            self._publish(key, view, state, current, current, plan, replicas, healthy=False, reason="NoLoadReport")
            return None
        if state.failing:
            log.info("autoscaling %s/%s: load reports again (%s routers)", *key, plan.heard)
        state.failing = False

        if not (decision.changed and decision.direction == "down"):
            # A scale-down goes by the costs the pods carry (plan_round): a cost rewritten in the
            # same round could reach the ReplicaSet before the new count and make it remove
            # another pod than the one the Event names. The next round writes them.
            await self._annotate(namespace, replicas, plan.costs)
        if decision.changed:
            await self._before_scale_down(key, deployment, plan, replicas)
            try:
                await self._scale(key, view, deployment, state, decision, plan)
            except KubeError as error:
                why = f"could not scale to {decision.desired} replicas ({error}): keeping {current}"
                log.warning("autoscaling %s/%s: %s", *key, why)
                self._publish(key, view, state, decision.desired, current, plan, replicas, why,
                              healthy=False, reason="ScaleFailed")
                return decision
        if plan.hot_models is not None:
            try:
                await self._write_hot_models(view, deployment, plan.hot_models)
                state.hot = plan.hot_models
            except KubeError as error:  # the list is a hint: the next round tries again
                log.warning("autoscaling %s/%s: hot-models list not written: %s", *key, error)
        self._publish(key, view, state, decision.desired, self.ctx.scaled.get(key, current), plan, replicas,
                      healthy=True, reason="ReadingLoad")
        return decision

    async def _read_reports(self, key: Key, deployment: Deployment, routers: list[dict[str, Any]]) -> list[LoadReport]:
        port = deployment.spec.router.port

        async def read(pod: dict[str, Any]) -> LoadReport | None:
            try:
                return await self.ctx.pods.load_report(key, pod["status"]["podIP"], port,
                                                       timeout_s=self.fetch_timeout_s)
            except PodCallError as error:
                log.debug("load report of router %s not read: %s", pod["metadata"]["name"], error)
                return None

        answers = await asyncio.gather(*(read(pod) for pod in routers))
        return [report for report in answers if report is not None]

    async def _annotate(self, namespace: str, replicas: list[scaling.ReplicaPod], costs: dict[str, int]) -> None:
        for pod, cost in scaling.cost_patches(replicas, costs).items():
            try:
                await self.ctx.kube.aannotate_pod(namespace, pod, {scaling.DELETION_COST_ANNOTATION: cost})
            except KubeError as error:
                if error.status != 404:  # a pod that just went: nothing to keep current
                    log.warning("pod-deletion-cost of %s/%s not written: %s", namespace, pod, error)

    async def _before_scale_down(self, key: Key, deployment: Deployment, plan: RoundPlan,
                                 replicas: list[scaling.ReplicaPod]) -> None:
        """The round's moves (hot models only the leaving pods hold, loaded on staying pods with
        room) and pins (declared copies on the staying pods), all at once, waited for."""
        if not plan.moves and not plan.pins:
            return
        ips = {pod.name: pod.ip for pod in replicas if pod.ip}

        async def load(model: str, target: str) -> str:
            try:
                await self.ctx.pods.load_model(key, ips[target], model, timeout_s=MOVE_TIMEOUT_S)
                return f"{model} -> {target}"
            except PodCallError as error:
                return f"{model} -> {target} (failed: {error})"

        moved, pinned = await asyncio.gather(
            asyncio.gather(*(load(model, target) for model, target in plan.moves if target in ips)),
            prewarm(self.ctx.pods, key, plan.pins, ips, deployment.spec.multiplexing.load_timeout_seconds + PIN_MARGIN_S))
        leaving = ", ".join(plan.leaving)
        if moved:
            log.info("autoscaling %s/%s: before removing %s, loaded elsewhere: %s", *key, leaving, "; ".join(moved))
        if pinned:
            log.info("autoscaling %s/%s: before removing %s, pinned copies on the staying pods: %s", *key, leaving,
                     "; ".join(pinned))

    async def _scale(self, key: Key, view: dict[str, Any], deployment: Deployment, state: ScaleState,
                     decision: ScaleDecision, plan: RoundPlan) -> None:
        async with self.ctx.lock(key):  # the reconcile's applies keep this count from now on
            await self.ctx.kube.ascale(deployment.namespace, builders.replica_name(deployment.name), decision.desired)
            self.ctx.scaled[key] = decision.desired
        state.last_scale = scaling.LastScale(self.wall(), decision.reason)
        event = scaling.scale_event(decision, plan.heard, plan.leaving_costs)
        post(view, [event])
        log.info("autoscaling %s/%s: %s", *key, event[2])

    async def _write_hot_models(self, view: dict[str, Any], deployment: Deployment, hot: tuple[str, ...]) -> None:
        # The apply reads the ConfigMap first and writes only a change: after a restart (nothing
        # written yet, as far as this process knows) an unchanged list costs no write.
        owner = builders.owner_reference({"metadata": view["metadata"]})
        await self.ctx.kube.aapply(builders.hot_models_config_map(deployment, owner, hot), view["metadata"]["uid"])

    def _publish(self, key: Key, view: dict[str, Any], state: ScaleState, desired: int, current: int,
                 plan: RoundPlan, replicas: list[scaling.ReplicaPod], message: str | None = None, *,
                 healthy: bool, reason: str) -> None:
        message = message or plan.message
        decision, report = plan.decision, plan.report
        ongoing = {r.name: r.ongoing for r in report.replicas} if report is not None else {}
        block = scaling.autoscaling_status(
            desired=desired, current=current,
            average_ongoing=decision.average_ongoing if decision else 0.0,
            queued=decision.queued if decision else 0, routers=plan.heard,
            replicas=[(pod.name, ongoing.get(pod.name, 0), plan.costs.get(pod.name, pod.cost or 0))
                      for pod in replicas],
            last_scale=state.last_scale, message=message,
        )
        generation = int(view["metadata"].get("generation") or 1)
        state.condition = scaling.autoscaling_condition(healthy, reason, message if not healthy else
                                                        f"load reports from {plan.heard} routers", generation,
                                                        state.condition, self.wall())
        self.ctx.autoscaling[key] = {"status": block, "condition": state.condition}
        self.on_status(key)


def _role(pod: dict[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE, "")
