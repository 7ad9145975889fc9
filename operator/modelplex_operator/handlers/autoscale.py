"""The autoscaler: every few seconds, for each MultiplexedDeployment with ``spec.autoscaling``,
read its routers' load reports, decide, and act.

One round for one resource (:meth:`AutoscaleLoop.round`):

1. list the deployment's pods; read ``GET /v1/load`` of every running router pod (pod IP and
   the router port; bounded by :data:`FETCH_TIMEOUT_S`, all at once) and add the reports up;
2. feed the sum to the resource's :class:`~modelplex.autoscaling.Autoscaler` (kept across
   rounds) and ask it for the replica count;
3. keep each replica pod's ``controller.kubernetes.io/pod-deletion-cost`` current (the requests
   a minute its cache serves), so a scale-down removes the coldest cache first;
4. on a scale-down, first load the hot models that only the leaving pods hold on staying
   replicas with room (at most :data:`~modelplex_operator.scaling.MAX_MOVES`, each bounded by
   :data:`MOVE_TIMEOUT_S`), then write the replica Deployment's count (scale subresource) and
   post a ScaledUp/ScaledDown Event with the inputs;
5. keep ConfigMap ``N-hot-models`` current (the hottest models, which a new replica pre-loads);
6. hand ``status.autoscaling`` and the ``Autoscaling`` condition to the status keeper (the
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
from urllib.parse import quote

import aiohttp

from modelplex.autoscaling import (
    LOAD_PATH,
    Autoscaler,
    LoadReport,
    ScaleDecision,
    deletion_costs,
    hottest_models,
    merge,
    parse_hot_models,
)
from modelplex.wire.names import LABEL_DEPLOYMENT, LABEL_ROLE, REPLICA_PORT, ROLE_REPLICA, ROLE_ROUTER
from modelplex.wire.spec import Autoscaling, Deployment, SpecError
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex_operator import builders, scaling
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.pinned import prewarm
from modelplex_operator.handlers.reconcile import post
from modelplex_operator.kube import KubeError
from modelplex_operator.pinning import prewarm_plan
from modelplex_operator.status import Key
from modelplex_operator.validation import validate

log = logging.getLogger("modelplex.operator.autoscale")

#: Seconds between rounds. The decision's own windows (lookBack, delays) are in seconds, so
#: this sets only how soon a change is seen: a request held at zero waits this at most.
TICK_S = 2.0
FETCH_TIMEOUT_S = 2.0
MOVE_TIMEOUT_S = 30.0
#: Models listed for pre-loading when the spec gives no maxModelsPerReplica (Ray's default).
DEFAULT_HOT_MODELS = 3


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
        fetch_timeout_s: float = FETCH_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = utc_now,
        on_status: Callable[[Key], None] = lambda key: None,
    ):
        """``on_status(key)`` is called when a resource's autoscaling status changed (the
        status keeper's ``poke``)."""
        self.ctx, self.on_status = ctx, on_status
        self.tick_s, self.fetch_timeout_s = tick_s, fetch_timeout_s
        self.clock, self.wall = clock, wall
        self.states: dict[Key, ScaleState] = {}
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

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
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        """Read, decide, act for one resource; returns the decision (None: none could be made)."""
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
        reports = await self._read_reports(deployment, routers)
        heard = f"{len(reports)}/{len(routers)}"
        current = self.ctx.autoscaled_replicas(key)
        if current is None:
            current = deployment.spec.starting_replicas

        if not reports:
            why = (f"no load report from the routers ({heard} answered): keeping {current} replicas"
                   if routers else f"no router pod runs yet: keeping {current} replicas")
            if not state.failing:
                log.warning("autoscaling %s/%s: %s", *key, why)
            state.failing = True
            self._publish(key, view, state, current, current, None, heard, replicas, {}, why, healthy=False,
                          reason="NoLoadReport")
            return None
        if state.failing:
            log.info("autoscaling %s/%s: load reports again (%s routers)", *key, heard)
        state.failing = False

        report = merge(reports)
        state.autoscaler.observe_report(report)
        decision = state.autoscaler.decide(current)
        costs = scaling.pod_costs(replicas, deletion_costs(report))
        await self._annotate(namespace, replicas, costs)
        if decision.changed:
            if decision.direction == "down":
                await self._move_hot_models(key, report, replicas, costs, current - decision.desired)
                await self._keep_pinned_copies(key, deployment, report, replicas, costs, current - decision.desired)
            try:
                await self._scale(key, view, deployment, state, decision, heard)
            except KubeError as error:
                why = f"could not scale to {decision.desired} replicas ({error}): keeping {current}"
                log.warning("autoscaling %s/%s: %s", *key, why)
                self._publish(key, view, state, decision.desired, current, decision, heard, replicas, costs, why,
                              healthy=False, reason="ScaleFailed", report=report)
                return decision
        try:
            await self._keep_hot_models(view, deployment, state, report)
        except KubeError as error:  # the list is a hint: the next round tries again
            log.warning("autoscaling %s/%s: hot-models list not written: %s", *key, error)
        self._publish(key, view, state, decision.desired, self.ctx.scaled.get(key, current), decision, heard,
                      replicas, costs, decision.reason, healthy=True, reason="ReadingLoad", report=report)
        return decision

    async def _read_reports(self, deployment: Deployment, routers: list[dict[str, Any]]) -> list[LoadReport]:
        port = deployment.spec.router.port
        token = self.ctx.credentials.token(deployment.namespace)
        headers = {INTERNAL_TOKEN_HEADER: token} if token else None

        async def read(pod: dict[str, Any]) -> LoadReport | None:
            url = f"http://{pod['status']['podIP']}:{port}{LOAD_PATH}"
            try:
                async with self._http().get(url, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=self.fetch_timeout_s)) as answer:
                    if answer.status != 200:
                        raise ValueError(f"HTTP {answer.status}")
                    return LoadReport.from_json(await answer.read())
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
                log.debug("load report of router %s (%s) not read: %s", pod["metadata"]["name"], url, error)
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

    async def _move_hot_models(self, key: Key, report: LoadReport, replicas: list[scaling.ReplicaPod],
                               costs: dict[str, int], count: int) -> None:
        """Load the hot models only the leaving pods hold on staying replicas first (cheap ones)."""
        leaving = scaling.leaving_pods(replicas, costs, count)
        ips = {pod.name: pod.ip for pod in replicas if pod.ready and pod.ip}
        moves = [(model, target) for model, target in scaling.cheap_moves(report, leaving) if target in ips]
        if not moves:
            return
        token = self.ctx.credentials.token(key[0])
        headers = {INTERNAL_TOKEN_HEADER: token} if token else None

        async def load(model: str, target: str) -> str:
            url = f"http://{ips[target]}:{REPLICA_PORT}/v1/models/{quote(model, safe='')}/load"
            try:
                async with self._http().post(url, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=MOVE_TIMEOUT_S)) as answer:
                    return f"{model} -> {target}" + ("" if answer.status == 200 else f" (HTTP {answer.status})")
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                return f"{model} -> {target} (failed: {error or type(error).__name__})"

        done = await asyncio.gather(*(load(model, target) for model, target in moves))
        log.info("autoscaling %s/%s: before removing %s, loaded elsewhere: %s", *key, ", ".join(leaving),
                 "; ".join(done))

    async def _keep_pinned_copies(self, key: Key, deployment: Deployment, report: LoadReport,
                                  replicas: list[scaling.ReplicaPod], costs: dict[str, int], count: int) -> None:
        """Pin the declared models (``spec.models`` ``minCopies``) on the pods that stay, where
        the routers will place them, and wait for their loads before the leaving pods go."""
        if not deployment.spec.pinned_models:
            return
        leaving = set(scaling.leaving_pods(replicas, costs, count))
        capacity = {r.name: r.capacity for r in report.replicas}
        staying = {pod.name: capacity.get(pod.name, 0) for pod in replicas
                   if pod.name not in leaving and pod.ready and pod.ip}
        plan = prewarm_plan(deployment.spec.pinned_models, staying)
        done = await prewarm(plan, {pod.name: pod.ip for pod in replicas}, self.ctx.credentials.token(key[0]),
                             deployment.spec.multiplexing.load_timeout_seconds + 5)
        if done:
            log.info("autoscaling %s/%s: before removing %s, pinned copies on the staying pods: %s", *key,
                     ", ".join(sorted(leaving)), "; ".join(done))

    async def _scale(self, key: Key, view: dict[str, Any], deployment: Deployment, state: ScaleState,
                     decision: ScaleDecision, heard: str) -> None:
        async with self.ctx.lock(key):  # the reconcile's applies keep this count from now on
            await self.ctx.kube.ascale(deployment.namespace, builders.replica_name(deployment.name), decision.desired)
            self.ctx.scaled[key] = decision.desired
        state.last_scale = scaling.LastScale(self.wall(), decision.reason)
        event = scaling.scale_event(decision, heard)
        post(view, [event])
        log.info("autoscaling %s/%s: %s", *key, event[2])

    async def _keep_hot_models(self, view: dict[str, Any], deployment: Deployment, state: ScaleState,
                               report: LoadReport) -> None:
        limit = deployment.spec.multiplexing.max_models_per_replica or DEFAULT_HOT_MODELS
        hot = tuple(hottest_models(report, limit))
        if state.hot is None and not hot:  # first round (or after a restart), nothing hot now
            existing = await asyncio.to_thread(self.ctx.kube.get, "v1", "ConfigMap", deployment.namespace,
                                               builders.hot_models_config_map_name(deployment.name))
            if existing is not None:
                state.hot = tuple(parse_hot_models((existing.get("data") or {}).get(builders.HOT_MODELS_FILE, "")))
                return
        # An idle pool has no rates: keep what was hot, so a replica started from zero
        # pre-loads the models its users asked for last.
        if state.hot is not None and (hot == state.hot or not hot):
            return
        owner = builders.owner_reference({"metadata": view["metadata"]})
        await self.ctx.kube.aapply(builders.hot_models_config_map(deployment, owner, hot), view["metadata"]["uid"])
        state.hot = hot

    def _publish(self, key: Key, view: dict[str, Any], state: ScaleState, desired: int, current: int,
                 decision: ScaleDecision | None, heard: str, replicas: list[scaling.ReplicaPod],
                 costs: dict[str, int], message: str, *, healthy: bool, reason: str,
                 report: LoadReport | None = None) -> None:
        ongoing = {r.name: r.ongoing for r in report.replicas} if report is not None else {}
        block = scaling.autoscaling_status(
            desired=desired, current=current,
            average_ongoing=decision.average_ongoing if decision else 0.0,
            queued=decision.queued if decision else 0, routers=heard,
            replicas=[(pod.name, ongoing.get(pod.name, 0), costs.get(pod.name, pod.cost or 0)) for pod in replicas],
            last_scale=state.last_scale, message=message,
        )
        generation = int(view["metadata"].get("generation") or 1)
        state.condition = scaling.autoscaling_condition(healthy, reason, message if not healthy else
                                                        f"load reports from {heard} routers", generation,
                                                        state.condition, self.wall())
        self.ctx.autoscaling[key] = {"status": block, "condition": state.condition}
        self.on_status(key)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session


def _role(pod: dict[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE, "")
