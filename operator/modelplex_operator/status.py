"""A MultiplexedDeployment's status, computed from what the operator sees (pure functions).

Inputs are small views of the owned Deployments and of the replica pods (built from API
objects by :func:`pod_view` and :func:`deployment_view`), the resource itself, and the outcome
of the last reconcile. The output is the whole ``status``: counts, ``loadedModels`` (models
loaded across the replica pods, a copy on each of two replicas counted twice: the pods'
``modelplex.io/loaded-models`` annotations carry a fixed-size summary, not lists), the pool's
bytes and byte budget, ``models`` (per model: its copies, the replicas holding it and its size,
merged from the replicas' ``GET /v1/models`` documents the keeper read, at most
:data:`MAX_STATUS_MODELS` of them), ``routerService``, ``observedGeneration``, the scale
subresource's ``selector`` and these conditions:

- ``Ready``: every wanted replica and router pod is ready on the current spec;
- ``Progressing``: the operator or a rollout is still getting there;
- ``Degraded``: something needs a person (an invalid spec, an object the API refused,
  a Deployment that cannot create its pods or is past its progress deadline);
- ``ModelsReported``: the operator could read every ready replica's models (False names the
  replicas it could not read; their last known models stay in ``models``);
- ``ModelsPinned`` (only with ``spec.models`` entries that set ``minCopies``): every declared
  model has its copies loaded (False names the models short of copies, with their actual and
  desired counts, and says when the spec cannot fit: more copies than ready replicas or model
  slots). Declared models come first in ``models``, with ``desiredCopies``;
- ``PodsScheduled``: no replica pod waits for a node (False while the scheduler finds none
  for some, e.g. ``nvidia.com/gpu: 1`` on a cluster without GPUs: they stay Pending, as Ray's
  actor would; the message is the scheduler's, and ``unschedulable`` names what they lack,
  shown by ``kubectl get mxd``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from modelplex.wire.loaded import LOADED_MODELS_PATH, LoadedModels, LoadedSummary, annotation_summary
from modelplex.wire.names import LABEL_ROLE, ROLE_REPLICA, ROLE_ROUTER
from modelplex.wire.pins import place_pins, shortfall_message
from modelplex.wire.spec import DEFAULT_ROUTER_PORT, DeploymentSpec
from modelplex_operator.builders import selector_string

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
MODELS_REPORTED = "ModelsReported"
MODELS_PINNED = "ModelsPinned"
PODS_SCHEDULED = "PodsScheduled"
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED, MODELS_REPORTED, MODELS_PINNED, PODS_SCHEDULED)

#: ``status.models`` lists at most this many models, most copies first, then the largest;
#: ``status.modelsOmitted`` counts the others. It keeps the resource small (etcd objects are
#: bounded) and ``kubectl get -o yaml`` readable; ``GET /v1/models`` on a replica has them all.
MAX_STATUS_MODELS = 50
#: Replica pods named per model in ``status.models[].replicas`` (``copies`` counts them all).
MAX_STATUS_HOLDERS = 10

# Outcome states of a reconcile.
OK = "ok"
INVALID = "invalid"  # the spec cannot be used (PermanentError)
REJECTED = "rejected"  # the API refused an object for good (PermanentError)
RETRYING = "retrying"  # a retry may help (TemporaryError)
CONFLICT = "conflict"  # an object of ours exists and belongs to someone else


@dataclass(frozen=True)
class PodView:
    name: str
    ready: bool = False
    deleting: bool = False
    summary: LoadedSummary = LoadedSummary()  # what its replica holds (its annotation)
    ip: str = ""  # where the operator reads its GET /v1/models
    unschedulable: str = ""  # the scheduler's message while it finds no node for the pod

    @property
    def models(self) -> int:
        return self.summary.models


@dataclass(frozen=True)
class DeploymentView:
    name: str
    role: str
    generation: int = 0
    observed_generation: int = 0
    replicas: int = 0  # wanted (spec)
    status_replicas: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0
    conditions: tuple[tuple[str, str, str, str], ...] = ()  # (type, status, reason, message)

    def condition(self, ctype: str) -> tuple[str, str, str, str] | None:
        return next((c for c in self.conditions if c[0] == ctype), None)

    @property
    def rolled_out(self) -> bool:
        """The Deployment controller has seen the latest template and every pod runs it."""
        return (
            self.observed_generation >= self.generation
            and self.updated == self.replicas
            and self.status_replicas == self.replicas
        )


#: A MultiplexedDeployment's (namespace, name): what the operator keys its state and indexes by.
Key = tuple[str, str]


@dataclass(frozen=True)
class Outcome:
    """What the last reconcile of one resource came to."""

    uid: str
    generation: int
    state: str
    reason: str = ""
    message: str = ""

    @property
    def final(self) -> bool:
        """The operator is done with this generation (success or refusal); not while retrying."""
        return self.state in (OK, INVALID, REJECTED)


@dataclass(frozen=True)
class Resource:
    """The parts of a MultiplexedDeployment that status needs."""

    name: str
    namespace: str
    uid: str = ""
    generation: int = 1
    #: The spec, parsed once where the operator read the object
    #: (:func:`modelplex_operator.handlers.observe.read_spec`); None when it does not parse.
    spec: DeploymentSpec | None = None
    status: Mapping[str, Any] = field(default_factory=dict)
    deleting: bool = False
    spec_problem: str = ""  # what validation found wrong with the current spec, if anything


# --------------------------------------------------------------------------- views of API objects


def _is_true(conditions: Iterable[Mapping[str, Any]] | None, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True" for c in conditions or ())


def loaded_summary(annotations: Mapping[str, str] | None) -> LoadedSummary:
    """What a replica pod reports holding; nothing when the annotation is missing or malformed."""
    try:
        return annotation_summary(annotations)
    except ValueError:
        return LoadedSummary()


def quantity(nbytes: int) -> str:
    """Bytes as a Kubernetes binary quantity, rounded down (``1536Mi``, ``12Gi``)."""
    for suffix, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.1f}".rstrip("0").rstrip(".") + suffix
    return str(nbytes)


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return PodView(
        name=meta.get("name", ""),
        ready=_is_true(status.get("conditions"), "Ready"),
        deleting=bool(meta.get("deletionTimestamp")),
        summary=loaded_summary(meta.get("annotations")),
        ip=status.get("podIP") or "",
        unschedulable=_unschedulable(status.get("conditions")),
    )


def _unschedulable(conditions: Iterable[Mapping[str, Any]] | None) -> str:
    """The scheduler's message when it found no node for the pod (it stays Pending, as a Ray
    actor asking for resources no node has stays pending), else ""."""
    for cond in conditions or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "no node can take the pod")
    return ""


#: "1 Insufficient nvidia.com/gpu." in the scheduler's message: the resource no node has enough of.
_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9][A-Za-z0-9./_-]*?)[.,]?(?=\s|$)")


def short_unschedulable(message: str) -> str:
    """What ``kubectl get`` shows of a scheduler's message: the resources it found short
    (``nvidia.com/gpu``), else its first clause."""
    short = sorted(set(_INSUFFICIENT.findall(message)))
    if short:
        return ", ".join(short)
    first = message.split(": ", 1)[-1].split(". ", 1)[0].rstrip(".")
    return first[:80]


def scheduling(pods: Iterable[PodView], generation: int) -> tuple[dict[str, Any], str | None]:
    """The ``PodsScheduled`` condition (False while replica pods wait for a node no one has,
    with the scheduler's message) and ``status.unschedulable`` (None when all are placed)."""
    waiting = sorted((pod for pod in pods if pod.unschedulable and not pod.deleting), key=lambda pod: pod.name)
    if not waiting:
        return _condition(PODS_SCHEDULED, True, "Scheduled", "", generation), None
    message = f"{len(waiting)} replica pod(s) Pending, no node can take them: {waiting[0].unschedulable}"
    return _condition(PODS_SCHEDULED, False, "Unschedulable", message, generation), \
        short_unschedulable(waiting[0].unschedulable)


def deployment_view(deployment: Mapping[str, Any]) -> DeploymentView:
    meta = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    conditions = tuple(
        (str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason", "")), str(c.get("message", "")))
        for c in status.get("conditions") or ()
    )
    return DeploymentView(
        name=meta.get("name", ""),
        role=(meta.get("labels") or {}).get(LABEL_ROLE, ""),
        generation=int(meta.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        replicas=int(spec["replicas"]) if spec.get("replicas") is not None else 1,
        status_replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        available=int(status.get("availableReplicas") or 0),
        conditions=conditions,
    )


# --------------------------------------------------------------------------- the status, in steps


def _condition(ctype: str, true: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": "True" if true else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


@dataclass(frozen=True)
class Problem:
    """Something a person must look at: the ``Degraded`` condition's reason and message."""

    reason: str
    message: str

    @property
    def blocks(self) -> bool:
        """The operator cannot act on the spec at all (not a failure that a retry or a rollout may end)."""
        return self.reason in ("InvalidSpec", "ApplyRejected")


@dataclass(frozen=True)
class Owned:
    """The two Deployments the operator made for a resource (``None``: not there, or not seen yet)."""

    replica: DeploymentView | None = None
    router: DeploymentView | None = None


def owned(deployments: Iterable[DeploymentView]) -> Owned:
    """The replica and router Deployments among ``deployments``, by their role label."""
    by_role = {view.role: view for view in deployments}
    return Owned(by_role.get(ROLE_REPLICA), by_role.get(ROLE_ROUTER))


@dataclass(frozen=True)
class Wanted:
    """What the spec asks for: replica and router pods, the router's port, the declared copies."""

    replicas: int
    routers: int
    port: int
    #: The autoscaler owns the replica count (and a pool at zero still serves).
    autoscaled: bool = False
    #: ``spec.models`` ids with ``minCopies``: id -> copies.
    pinned: Mapping[str, int] = field(default_factory=dict)


def wanted(spec: DeploymentSpec | None, deployments: Owned) -> Wanted:
    """What ``spec`` asks for; with no usable spec, what the Deployments still ask for (the
    operator applied nothing since the last valid spec) and the spec module's default port."""
    replica, router = deployments.replica, deployments.router
    if spec is None:
        return Wanted(replica.replicas if replica else 0, router.replicas if router else 0, DEFAULT_ROUTER_PORT)
    autoscaled = spec.autoscaling is not None
    replicas = spec.starting_replicas
    if autoscaled and replica:  # the autoscaler owns the count: the replica Deployment has it
        replicas = replica.replicas
    return Wanted(replicas, spec.router.replicas, spec.router.port, autoscaled, spec.pinned_models)


@dataclass(frozen=True)
class Pool:
    """The replica pods that are not terminating, and what their annotations add up to."""

    pods: tuple[PodView, ...] = ()

    @property
    def copies(self) -> int:
        """Models loaded across the pods, a model on two pods counted twice (``loadedModels``)."""
        return sum(pod.models for pod in self.pods)

    @property
    def bytes(self) -> int:
        return sum(pod.summary.bytes for pod in self.pods)

    @property
    def capacity_bytes(self) -> int:
        return sum(pod.summary.capacity_bytes for pod in self.pods)

    @property
    def memory(self) -> str:
        """For ``kubectl get mxd -o wide``: used / budget of the replicas' model caches."""
        return quantity(self.bytes) + (f"/{quantity(self.capacity_bytes)}" if self.capacity_bytes else "")

    @property
    def names(self) -> frozenset[str]:
        return frozenset(pod.name for pod in self.pods)

    @property
    def ready(self) -> frozenset[str]:
        return frozenset(pod.name for pod in self.pods if pod.ready)

    @property
    def ready_capacities(self) -> dict[str, int]:
        """Ready pod -> its model capacity (0: unknown), what pinned copies are placed on."""
        return {pod.name: pod.summary.capacity for pod in self.pods if pod.ready}


def pool_of(pods: Iterable[PodView]) -> Pool:
    """The pool of replica pods, those being deleted left out."""
    return Pool(tuple(pod for pod in pods if not pod.deleting))


@dataclass(frozen=True)
class Reconciled:
    """Where the operator stands with the resource's current generation."""

    generation: int
    #: The generation the operator is done with (``status.observedGeneration``); None: none yet.
    observed: int | None
    #: The last reconcile of this object (an outcome of an earlier object of the same name is dropped).
    outcome: Outcome | None

    @property
    def current(self) -> Outcome | None:
        """The last reconcile's outcome if it was of the current generation."""
        return self.outcome if self.outcome is not None and self.outcome.generation == self.generation else None

    @property
    def caught_up(self) -> bool:
        return self.observed is not None and self.observed >= self.generation


def reconciled(resource: Resource, outcome: Outcome | None) -> Reconciled:
    """The outcome that belongs to ``resource`` and the generation it makes observed."""
    if outcome is not None and outcome.uid not in ("", resource.uid):
        outcome = None  # an outcome of an earlier object of the same name
    observed = (resource.status or {}).get("observedGeneration")
    if outcome is not None and outcome.final:
        observed = outcome.generation
    return Reconciled(resource.generation, None if observed is None else int(observed), outcome)


def replica_counts(deployments: Owned) -> dict[str, int]:
    """``replicas``, ``readyReplicas``, ``updatedReplicas``: the replica Deployment's pods."""
    replica = deployments.replica
    return {
        "replicas": replica.status_replicas if replica else 0,
        "readyReplicas": replica.ready if replica else 0,
        "updatedReplicas": replica.updated if replica else 0,
    }


def _deployment_problem(view: DeploymentView | None) -> Problem | None:
    if view is None:
        return None
    failure = view.condition("ReplicaFailure")
    if failure and failure[1] == "True":
        return Problem("ReplicaFailure", f"Deployment {view.name}: {failure[3] or failure[2]}")
    progressing = view.condition("Progressing")
    if progressing and progressing[1] == "False" and progressing[2] == "ProgressDeadlineExceeded":
        return Problem("ProgressDeadlineExceeded", f"Deployment {view.name}: {progressing[3] or progressing[2]}")
    return None


def problem_of(resource: Resource, state: Reconciled, deployments: Owned) -> Problem | None:
    """What ``Degraded`` reports, first found first: the spec, the last reconcile of this
    generation, what the operator knew before a restart, then the Deployments' own trouble."""
    if resource.spec_problem:
        return Problem("InvalidSpec", resource.spec_problem)
    current = state.current
    if current is not None and current.state in (INVALID, REJECTED, RETRYING, CONFLICT):
        return Problem(current.reason or "ReconcileFailed", current.message)
    if state.outcome is None:
        previous = _previous_problem(resource.status or {}, state.generation)
        if previous is not None:  # the operator restarted: keep what it knew
            return previous
    return _deployment_problem(deployments.replica) or _deployment_problem(deployments.router)


def degraded_condition(problem: Problem | None, generation: int) -> dict[str, Any]:
    if problem is None:
        return _condition(DEGRADED, False, "AsExpected", "", generation)
    return _condition(DEGRADED, True, problem.reason, problem.message, generation)


def serving_conditions(
    want: Wanted, state: Reconciled, deployments: Owned, problem: Problem | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``Ready`` and ``Progressing`` conditions."""
    gen = state.generation
    # A spec problem is always the problem (problem_of puts it first), and it blocks.
    if problem is not None and problem.blocks:
        return (_condition(READY, False, problem.reason, problem.message, gen),
                _condition(PROGRESSING, False, problem.reason, "the operator cannot act on this spec", gen))
    counts = _counts(want, deployments)
    progress_reason, progress_message = _progress(state.caught_up, want, deployments)
    progressing = _condition(PROGRESSING, progress_reason is not None, progress_reason or "RolloutComplete",
                             progress_message or counts, gen)
    ready_reason, ready_message = _readiness(state.caught_up, want, deployments, problem)
    serving = ready_reason == "AllReplicasReady"
    if want.autoscaled and ready_reason == "ScaledToZero":
        # An autoscaled pool at zero serves: its routers hold a request while a replica starts.
        router = deployments.router
        serving = router is not None and router.ready >= want.routers > 0
        ready_message = ("the autoscaler scaled the pool to zero: the next request starts a replica"
                         if serving else counts)
    return _condition(READY, serving, ready_reason, ready_message, gen), progressing


def model_entries(
    documents: Mapping[str, LoadedModels], limit: int = MAX_STATUS_MODELS, pinned: Mapping[str, int] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """``status.models`` from each replica pod's document (pod name -> document), and how many
    models were left out. A model's ``bytes`` is one copy's measured size (0: unknown).
    Declared models (``pinned``: id -> ``minCopies``) come first, held or not, with ``desiredCopies``."""
    pinned = pinned or {}
    holders: dict[str, list[str]] = {model: [] for model in pinned}
    sizes: dict[str, int] = dict.fromkeys(pinned, 0)
    for pod in sorted(documents):
        document = documents[pod]
        for model in document.models:
            holders.setdefault(model, []).append(pod)
            sizes[model] = max(sizes.get(model, 0), document.model_bytes.get(model, 0))
    ranked = sorted(holders, key=lambda model: (model not in pinned, -len(holders[model]), -sizes[model], model))
    entries = [{"name": model, "copies": len(holders[model]), "bytes": sizes[model],
                "replicas": holders[model][:MAX_STATUS_HOLDERS]} for model in ranked[:limit]]
    for entry, model in zip(entries, ranked):
        if model in pinned:
            entry["desiredCopies"] = pinned[model]
    return entries, len(ranked) - len(entries)


def models_pinned(pinned: Mapping[str, int], documents: Mapping[str, LoadedModels],
                  ready: Mapping[str, int], generation: int) -> dict[str, Any]:
    """The ``ModelsPinned`` condition: declared copies (``pinned``) against the copies the ready
    replicas' documents show (``ready``: ready replica pod -> its model capacity, 0 unknown)."""
    actual = {model: sum(1 for pod in ready if model in (documents.get(pod) or LoadedModels()).models)
              for model in pinned}
    short = sorted(model for model in pinned if actual[model] < pinned[model])
    if not short:
        return _condition(MODELS_PINNED, True, "CopiesLoaded",
                          f"{len(pinned)} declared model(s) have their copies loaded", generation)
    parts = [f"{model}: {actual[model]}/{pinned[model]} copies" for model in short[:5]]
    if len(short) > 5:
        parts.append(f"and {len(short) - 5} more")
    message = "; ".join(parts)
    missing = place_pins(pinned, ready).missing
    if missing:
        return _condition(MODELS_PINNED, False, "CannotFit",
                          f"{message}. Cannot fit: {shortfall_message(pinned, missing, len(ready))}", generation)
    return _condition(MODELS_PINNED, False, "CopiesMissing", f"{message} (loading, or a replica is not ready)",
                      generation)


def models_reported(unreported: Mapping[str, str], pool: Pool, generation: int) -> dict[str, Any]:
    """The ``ModelsReported`` condition: the ready pods whose ``GET /v1/models`` failed, with why
    (a pod that is not ready is not read: not hearing from it is no news)."""
    unreported = {pod: why for pod, why in unreported.items() if pod in pool.ready}
    if not unreported:
        return _condition(MODELS_REPORTED, True, "Reported", "", generation)
    named = sorted(unreported)
    message = "; ".join(f"{pod}: {unreported[pod]}" for pod in named[:3])
    if len(named) > 3:
        message += f"; and {len(named) - 3} more"
    return _condition(MODELS_REPORTED, False, "ReplicaUnreachable",
                      f"GET {LOADED_MODELS_PATH} failed on {message} (their last known models are shown)", generation)


def compute_status(
    resource: Resource,
    deployments: Iterable[DeploymentView],
    pods: Iterable[PodView],
    outcome: Outcome | None,
    now: str,
    documents: Mapping[str, LoadedModels] | None = None,
    unreported: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The whole status of ``resource``; conditions keep their ``lastTransitionTime`` unless they flip.

    ``documents`` are the last known loaded-models documents by replica pod name, ``unreported``
    the pods whose latest read failed, with why (both from :mod:`modelplex_operator.documents`).
    """
    documents = documents or {}
    pods = list(pods)  # read twice: the pool, the scheduling
    owned_ = owned(deployments)
    want = wanted(resource.spec, owned_)
    pool = pool_of(pods)
    state = reconciled(resource, outcome)
    gen = resource.generation
    models, omitted = model_entries({pod: doc for pod, doc in documents.items() if pod in pool.names},
                                    pinned=want.pinned)
    status: dict[str, Any] = {
        **replica_counts(owned_),
        "loadedModels": pool.copies,
        "poolBytes": pool.bytes,
        "poolCapacityBytes": pool.capacity_bytes,
        "poolMemory": pool.memory,
        "models": models,
        "modelsOmitted": omitted,
        "routerService": f"{resource.name}.{resource.namespace}.svc:{want.port}",
        "selector": selector_string(resource.name),
    }
    if state.observed is not None:
        status["observedGeneration"] = state.observed

    problem = problem_of(resource, state, owned_)
    ready, progressing = serving_conditions(want, state, owned_, problem)
    scheduled, status["unschedulable"] = scheduling(pods, gen)
    conditions = [ready, progressing, degraded_condition(problem, gen), models_reported(unreported or {}, pool, gen),
                  scheduled]
    if want.pinned:
        conditions.append(models_pinned(want.pinned, documents, pool.ready_capacities, gen))
    status["conditions"] = merge_conditions((resource.status or {}).get("conditions") or [], conditions, now)
    return status


_OPERATOR_REASONS = ("InvalidSpec", "ApplyRejected", "ApplyFailed", "ObjectConflict")


def _previous_problem(current: Mapping[str, Any], generation: int) -> Problem | None:
    for cond in current.get("conditions") or ():
        if (cond.get("type") == DEGRADED and cond.get("status") == "True"
                and cond.get("reason") in _OPERATOR_REASONS and cond.get("observedGeneration") == generation):
            return Problem(cond.get("reason", ""), cond.get("message", ""))
    return None


def _counts(want: Wanted, deployments: Owned) -> str:
    ready = deployments.replica.ready if deployments.replica else 0
    routers = deployments.router.ready if deployments.router else 0
    return f"{ready}/{want.replicas} replicas and {routers}/{want.routers} routers ready"


def _progress(caught_up: bool, want: Wanted, deployments: Owned) -> tuple[str | None, str | None]:
    replica, router = deployments.replica, deployments.router
    if not caught_up:
        return "Reconciling", "the operator is applying the latest spec"
    if replica is None or router is None:
        missing = ", ".join(n for n, v in (("replica", replica), ("router", router)) if v is None)
        return "Creating", f"waiting for the {missing} Deployment"
    for view, wanted_, what in ((replica, want.replicas, "replica"), (router, want.routers, "router")):
        if view.replicas != wanted_ or view.observed_generation < view.generation:
            return "Reconciling", f"the {what} Deployment has not caught up with the spec yet"
        if view.updated < wanted_:
            return "RollingOut", f"{view.updated}/{wanted_} {what} pods run the latest spec"
        if view.status_replicas > wanted_:
            verb = "RollingOut" if view.updated < view.status_replicas else "ScalingDown"
            return verb, f"{view.status_replicas - wanted_} old {what} pods are still terminating"
        # A router is ready only while a replica is: with no replicas wanted, none will be.
        if view.ready < wanted_ and not (what == "router" and want.replicas == 0):
            return "ScalingUp", f"{view.ready}/{wanted_} {what} pods ready"
    return None, None


def _readiness(caught_up: bool, want: Wanted, deployments: Owned, problem: Problem | None) -> tuple[str, str]:
    replica, router = deployments.replica, deployments.router
    counts = _counts(want, deployments)
    # Ready says whether the pool serves as the spec asks, now: a scale-up is not ready until the
    # new pods are; a spec the operator has not applied yet does not by itself make it unready.
    if problem is not None and problem.reason in ("ApplyFailed", "ObjectConflict") and not caught_up:
        return problem.reason, problem.message
    if want.replicas == 0:
        return "ScaledToZero", "spec.replicas is 0: nothing serves"
    if want.routers == 0:
        return "NoRouter", "spec.router.replicas is 0: nothing routes"
    if replica is None or replica.ready < want.replicas:
        return "ReplicasNotReady", counts
    if router is None or router.ready < want.routers:
        return "RouterNotReady", counts
    return "AllReplicasReady", counts


def merge_conditions(old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]], now: str) -> list[dict[str, Any]]:
    """``new`` with ``lastTransitionTime`` carried over from ``old`` where the status did not flip."""
    previous = {c.get("type"): c for c in old}
    merged = []
    for cond in new:
        cond = dict(cond)
        before = previous.get(cond["type"])
        if before is not None and before.get("status") == cond["status"] and before.get("lastTransitionTime"):
            cond["lastTransitionTime"] = before["lastTransitionTime"]
        else:
            cond["lastTransitionTime"] = now
        merged.append(cond)
    return merged


def condition(status: Mapping[str, Any] | None, ctype: str) -> Mapping[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or () if c.get("type") == ctype), None)


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Events worth posting for a status change: ``(type, reason, message)``.

    Ready turning True (Normal) or False (Warning), and Degraded turning True for a reason the
    Deployments gave (the operator posts its own refusals when it makes them).
    """
    events = []
    before_ready, after_ready = condition(old, READY), condition(new, READY)
    if after_ready is not None:
        was = before_ready.get("status") if before_ready else None
        now_ = after_ready.get("status")
        if now_ == "True" and was != "True":
            events.append(("Normal", "Ready", after_ready.get("message", "")))
        elif now_ == "False" and was == "True" and _is_status(new, PROGRESSING, "False"):
            # Unready while a rollout or scale-up is under way is expected: no Warning for it.
            events.append(("Warning", "NotReady", f"{after_ready.get('reason')}: {after_ready.get('message', '')}"))
    events.extend(_pinned_events(condition(old, MODELS_PINNED), condition(new, MODELS_PINNED)))
    events.extend(_scheduling_events(condition(old, PODS_SCHEDULED), condition(new, PODS_SCHEDULED)))
    before_deg, after_deg = condition(old, DEGRADED), condition(new, DEGRADED)
    if (after_deg is not None and after_deg.get("status") == "True"
            and after_deg.get("reason") not in _OPERATOR_REASONS
            and (before_deg is None or before_deg.get("status") != "True"
                 or before_deg.get("reason") != after_deg.get("reason"))):
        events.append(("Warning", after_deg.get("reason", "Degraded"), after_deg.get("message", "")))
    return events


def _pinned_events(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """``ModelsPinned`` changing: Normal when the copies are all in again, Warning when a spec
    cannot fit or copies went missing that were there (copies still loading at first are no news)."""
    if after is None:
        return []
    was, was_reason = (before.get("status"), before.get("reason")) if before else (None, None)
    now_, reason, message = after.get("status"), after.get("reason", ""), after.get("message", "")
    if now_ == "True" and was == "False":
        return [("Normal", "ModelsPinned", message)]
    if now_ == "False" and (was == "True" or (reason == "CannotFit" and was_reason != "CannotFit")):
        return [("Warning", f"Pinned{reason}", message)]
    return []


def _scheduling_events(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """``PodsScheduled`` turning False (Warning ``Unschedulable``: what the pods lack), and True
    again after it was False (Normal ``Scheduled``)."""
    if after is None:
        return []
    was, now_ = (before.get("status") if before else None), after.get("status")
    if now_ == "False" and was != "False":
        return [("Warning", "Unschedulable", after.get("message", ""))]
    if now_ == "True" and was == "False":
        return [("Normal", "Scheduled", "the replica pods that waited for a node are placed")]
    return []


def _is_status(status: Mapping[str, Any], ctype: str, value: str) -> bool:
    cond = condition(status, ctype)
    return cond is not None and cond.get("status") == value


def status_differs(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """True when writing ``desired`` would change the stored status."""
    current = current or {}
    return any(current.get(key) != value for key, value in desired.items())
