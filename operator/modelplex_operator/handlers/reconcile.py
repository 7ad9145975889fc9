"""Reconcile one MultiplexedDeployment: validate, apply the desired objects, report.

``reconcile`` is the kopf handler for create, update and resume. It raises
``kopf.PermanentError`` for what retrying cannot fix (an invalid spec, an object the API
refuses) and ``kopf.TemporaryError(delay=...)`` with a growing delay for what it may fix
(the API unreachable or throttling, RBAC not granted yet, an object of ours owned by someone
else). Every apply is a server-side apply of a complete object, so running it again, after a
crash halfway or an operator restart, converges on the same objects: nothing is doubled.

``repair`` is the same apply (:func:`apply_and_record`) without kopf's error protocol, for the
status keeper (an owned Deployment was deleted, or the periodic resync).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, cast

import kopf

from modelplex.wire.names import LABEL_ROLE
from modelplex.wire.spec import Deployment, SpecError
from modelplex_operator import builders
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.pinned import before_scale_down
from modelplex_operator.kube import ApplyResult, KubeError, NotOwned
from modelplex_operator.pools import ENDPOINT_PICKER
from modelplex_operator.references import check_references
from modelplex_operator.status import CONFLICT, INVALID, OK, REJECTED, RETRYING, Key, Outcome
from modelplex_operator.validation import problems_of, validate

log = logging.getLogger("modelplex.operator.reconcile")

MAX_DELAY_S = 30.0
CONFLICT_DELAY_S = 30.0

Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class Applied:
    """What one apply of a resource's desired objects came to."""

    outcome: Outcome
    changes: list[Event]  # the Events its changes deserve (none when it failed)
    error: KubeError | NotOwned | None = None  # why it failed


def backoff(retry: int) -> float:
    """Seconds before retry number ``retry`` (0-based): 1, 2, 4, ... capped at 30."""
    return float(min(2 ** max(retry, 0), MAX_DELAY_S))


def key_of(body: Mapping[str, Any]) -> Key:
    meta = body["metadata"]
    return meta.get("namespace") or "default", meta["name"]


async def apply_all(ctx: OperatorContext, body: Mapping[str, Any], deployment: Deployment) -> list[tuple[dict, ApplyResult]]:
    """Apply every desired object in order; stops at the first error (the next run resumes)."""
    meta = body["metadata"]
    owner = builders.owner_reference({"metadata": dict(meta)})
    results = []
    async with ctx.lock(key_of(body)):
        # The pods mount the deployment's internal credential: it exists before them.
        await ctx.credentials.ensure(deployment, owner)
        # A scale-down of declared copies pins them on the pods that stay before any pod goes.
        await before_scale_down(ctx, key_of(body), deployment)
        # Under the lock the autoscaler takes to scale: the count an apply keeps is its latest.
        objects = builders.desired_objects(deployment, owner, ctx.build_settings,
                                           replicas=ctx.autoscaled_replicas(key_of(body)))
        for obj in objects:
            results.append((obj, await ctx.kube.aapply(obj, meta["uid"])))
        results.extend(await apply_pool(ctx, body, deployment, owner))
        # Which templates the pods must run before an upgrade from a namespace credential ends.
        ctx.credentials.applied(key_of(body), {
            obj["metadata"]["labels"].get(LABEL_ROLE, ""): int((result.after.get("metadata") or {}).get("generation") or 0)
            for obj, result in results if obj["kind"] == "Deployment"})
    return results


async def apply_pool(ctx: OperatorContext, body: Mapping[str, Any], deployment: Deployment,
                     owner: dict[str, Any]) -> list[tuple[dict, ApplyResult]]:
    """The InferencePool (:mod:`modelplex_operator.pools`): applied with the picker on, deleted
    with it off; its ``EndpointPicker`` condition kept with the reconcile's warnings, and a
    Warning Event when it turns False (the CRD missing, say). Never raises for the pool: nothing
    else fails for it."""
    synced = await asyncio.to_thread(ctx.pools.sync, deployment, owner, int(body["metadata"].get("generation") or 1))
    warnings = ctx.warnings.setdefault(key_of(body), {})
    warnings.pop(ENDPOINT_PICKER, None)
    if synced.condition is not None:
        warnings[ENDPOINT_PICKER] = synced.condition
    if synced.warn and synced.condition is not None:
        post(body, [("Warning", f"{ENDPOINT_PICKER}{synced.condition['reason']}", synced.condition["message"])])
    return [(synced.pool, synced.result)] if synced.pool is not None and synced.result is not None else []


def _template_hash(obj: Mapping[str, Any] | None) -> str | None:
    template = ((obj or {}).get("spec") or {}).get("template") or {}
    return ((template.get("metadata") or {}).get("annotations") or {}).get(builders.ANNOTATION_SPEC_HASH)


def describe_changes(results: Iterable[tuple[Mapping[str, Any], ApplyResult]]) -> list[Event]:
    """The Events an apply deserves, as ``(type, reason, message)``: what was created, what
    was scaled, which pods roll because the spec changed, what else was updated."""
    created, updated, scaled, rolled = [], [], [], []
    for obj, result in results:
        what = builders.describe(dict(obj))
        if result.action == "created":
            created.append(what)
        elif result.action == "updated":
            if obj["kind"] == "Deployment":
                old_n = ((result.before or {}).get("spec") or {}).get("replicas")
                new_n = (result.after.get("spec") or {}).get("replicas")
                old_h, new_h = _template_hash(result.before), _template_hash(result.after)
                if old_n != new_n:
                    scaled.append(f"{what} from {old_n} to {new_n}")
                if old_h != new_h:
                    rolled.append(f"{what} (spec {old_h} -> {new_h})")
                if old_n == new_n and old_h == new_h:
                    updated.append(what)
            else:
                updated.append(what)
    events = []
    if created:
        events.append(("Normal", "Created", "created " + ", ".join(created)))
    if scaled:
        events.append(("Normal", "Scaled", "scaled " + ", ".join(scaled)))
    if rolled:
        events.append(("Normal", "RollingUpdate", "the spec changed: rolling the pods of " + ", ".join(rolled)))
    if updated:
        events.append(("Normal", "Updated", "updated " + ", ".join(updated)))
    return events


def post(body: Mapping[str, Any], events: Iterable[Event]) -> None:
    """Post ``events`` on ``body``'s object (each message cut to the 1,000 characters an Event keeps)."""
    for etype, reason, message in events:
        # kopf.event reads any mapping; its annotation names only kopf's own Body class.
        kopf.event(cast(kopf.Body, dict(body)), type=etype, reason=reason, message=message[:1000])


async def apply_and_record(ctx: OperatorContext, body: Mapping[str, Any], deployment: Deployment, *,
                           retrying: str = "") -> Applied:
    """Apply the desired objects of ``body`` and record the outcome in ``ctx`` (the one flow of
    the reconcile handler and of the keeper's repairs). An outcome for a generation older than
    the one recorded is not recorded: the keeper's view of a resource can lag kopf's.
    ``retrying`` is added to a retryable failure's message (when kopf tries again)."""
    meta = body["metadata"]
    key = key_of(body)
    uid, generation = meta["uid"], int(meta.get("generation") or 1)
    changes: list[Event] = []
    error: KubeError | NotOwned | None = None
    try:
        results = await apply_all(ctx, body, deployment)
    except NotOwned as failure:
        error, outcome = failure, Outcome(uid, generation, CONFLICT, "ObjectConflict", str(failure))
    except KubeError as failure:
        error = failure
        if failure.retryable:
            outcome = Outcome(uid, generation, RETRYING, "ApplyFailed", f"{failure} ({retrying})" if retrying
                              else str(failure))
        else:
            outcome = Outcome(uid, generation, REJECTED, "ApplyRejected", str(failure))
    else:
        outcome = Outcome(uid, generation, OK, "Reconciled", f"applied {len(results)} objects")
        changes = describe_changes(results)
    previous = ctx.outcomes.get(key)
    if previous is None or previous.uid != uid or previous.generation <= generation:
        ctx.record(key, outcome)
    return Applied(outcome, changes, error)


async def reconcile(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> Outcome:
    """The create/update/resume handler: validate, apply, record the outcome, post Events.
    Returns the outcome when it succeeded; raises kopf's errors when it did not (the outcome
    is recorded either way, and the caller pokes the status keeper)."""
    meta = body["metadata"]
    key = key_of(body)
    generation = int(meta.get("generation") or 1)
    try:
        deployment = validate(body)
        warnings = await check_references(ctx.kube, deployment, body)
    except SpecError as error:
        message = problems_of(error)
        ctx.record(key, Outcome(meta["uid"], generation, INVALID, "InvalidSpec", message))
        post(body, [("Warning", "InvalidSpec", message)])
        log.warning("%s/%s: invalid spec (generation %s): %s", *key, generation, message)
        raise kopf.PermanentError(f"invalid spec: {message}") from None
    if warnings.keys() - ctx.warnings.get(key, {}).keys():
        post(body, [("Warning", cond["reason"], cond["message"]) for cond in warnings.values()])
    ctx.warnings[key] = warnings

    delay = backoff(retry)
    applied = await apply_and_record(ctx, body, deployment, retrying=f"retry {retry + 1} in {delay:.0f}s")
    outcome = applied.outcome
    if outcome.state == CONFLICT:
        post(body, [("Warning", outcome.reason, outcome.message)])
        raise kopf.TemporaryError(outcome.message, delay=CONFLICT_DELAY_S)
    if outcome.state == REJECTED:
        post(body, [("Warning", outcome.reason, outcome.message)])
        raise kopf.PermanentError(outcome.message)
    if outcome.state == RETRYING:
        log.warning("%s/%s: %s; retrying in %.0fs", *key, applied.error, delay)
        raise kopf.TemporaryError(str(applied.error), delay=delay)
    post(body, applied.changes)
    log.info("%s/%s: reconciled generation %s: %s", *key, generation,
             "; ".join(message for _, _, message in applied.changes) or "nothing changed")
    return outcome


async def repair(ctx: OperatorContext, body: Mapping[str, Any]) -> list[Event]:
    """Apply again (drift repair, for the status keeper); records the outcome, returns the
    Events it posted."""
    meta = body["metadata"]
    key = key_of(body)
    try:
        deployment = validate(body)
    except SpecError:
        return []  # the reconcile handler reported it
    uid, generation = meta["uid"], int(meta.get("generation") or 1)
    previous = ctx.outcomes.get(key)
    if previous is not None and previous.uid == uid and previous.generation == generation and not previous.final:
        return []  # the reconcile handler is retrying this generation: leave it to kopf
    applied = await apply_and_record(ctx, body, deployment)
    if applied.error is not None:
        log.warning("repairing %s/%s failed: %s", *key, applied.error)
        return []
    events = [(etype, "Repaired" if reason == "Created" else reason, message)
              for etype, reason, message in applied.changes]
    post(body, events)
    if events:
        log.info("repaired %s/%s: %s", *key, "; ".join(m for _, _, m in events))
    return events
