"""Pre-warming declared copies before a scale-down (:mod:`modelplex_operator.pinning`): the I/O.

:func:`prewarm` pins models on replica pods and waits for their loads (``POST /v1/pins`` with
``wait``, through the operator's pod client); :func:`before_scale_down` is the ``spec.replicas``
path (the autoscaler's pins come from its round, :func:`modelplex.autoscaling.plan_round`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Mapping

from modelplex.autoscaling import DELETION_COST_ANNOTATION, PIN_MARGIN_S
from modelplex.wire.names import ROLE_REPLICA
from modelplex.wire.spec import Deployment
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.kube import KubeError
from modelplex_operator.pinning import LEAVING_COST, leaving_for_scale_down, prewarm_plan
from modelplex_operator.pods import PodCallError, PodClient
from modelplex_operator.status import Key

log = logging.getLogger("modelplex.operator.pinned")


async def prewarm(pods: PodClient, key: Key, plan: Mapping[str, tuple[str, ...]], ips: Mapping[str, str],
                  timeout_s: float) -> list[str]:
    """Pin ``plan``'s models on the pods of ``key`` (by pod IP) and wait for their loads, each pod
    within ``timeout_s``; one line per pod of what happened, for the log."""
    async def pin(pod: str, models: tuple[str, ...]) -> str:
        try:
            errors = await pods.pin(key, ips[pod], models, timeout_s=timeout_s)
        except PodCallError as error:
            return f"{pod}: {', '.join(models)} not pinned ({error})"
        failed = f" (failed: {', '.join(sorted(errors))})" if errors else ""
        return f"{pod}: {', '.join(models)}{failed}"

    return list(await asyncio.gather(*(pin(pod, models) for pod, models in plan.items() if pod in ips)))


async def before_scale_down(ctx: OperatorContext, key: Key, deployment: Deployment) -> None:
    """A ``spec.replicas`` scale-down of a deployment with declared copies: choose the pods that
    go (marking them with the lowest deletion cost, so the ReplicaSet takes them), pin the
    declared models on the pods that stay and wait for the loads; then the caller lowers the
    count. Nothing to do without declared copies, with autoscaling (its own path) or to zero."""
    spec = deployment.spec
    pinned = spec.pinned_models
    if not pinned or spec.autoscaling is not None or ctx.indexes is None:
        return
    wanted_now = next((view.replicas for view in ctx.indexes.deployments_of(key) if view.role == ROLE_REPLICA), None)
    desired = spec.starting_replicas
    pods = [pod for pod in ctx.indexes.pods_of(key) if not pod.deleting]
    if wanted_now is None or desired >= wanted_now or desired == 0 or len(pods) <= desired:
        return
    leaving = leaving_for_scale_down(pods, len(pods) - desired)
    staying = {pod.name: pod.summary.capacity for pod in pods if pod.name not in leaving and pod.ready and pod.ip}
    for pod in leaving:
        try:
            await ctx.kube.aannotate_pod(deployment.namespace, pod, {DELETION_COST_ANNOTATION: str(LEAVING_COST)})
        except KubeError as error:
            log.warning("scale-down of %s/%s: pod-deletion-cost of %s not written: %s", *key, pod, error)
    plan = prewarm_plan(pinned, staying)
    done = await prewarm(ctx.pods, key, plan, {pod.name: pod.ip for pod in pods if pod.ip},
                         spec.multiplexing.load_timeout_seconds + PIN_MARGIN_S)
    log.info("scale-down of %s/%s to %d: before removing %s, pinned copies on the staying pods: %s", *key, desired,
             ", ".join(leaving), "; ".join(done) or "none needed")
