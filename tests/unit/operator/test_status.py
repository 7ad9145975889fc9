"""Status computation: counts, loadedModels from the annotations, models from the documents, the conditions."""

from __future__ import annotations

import json

from modelplex.wire.loaded import LoadedSummary
from modelplex.wire.names import ANNOTATION_LOADED_MODELS
from modelplex.wire.spec import DEFAULT_ROUTER_PORT, DEFAULT_ROUTER_REPLICAS, parse_spec
from modelplex_operator.status import (INVALID, OK, REJECTED, RETRYING, DeploymentView, Outcome, PodView, Resource,
                                       compute_status, condition, deployment_view, loaded_summary, merge_conditions,
                                       pod_view, quantity, status_differs, transitions)

UID = "uid-1"
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def resource(generation=1, status=None, problem="", **spec):
    base = {"replicas": 2, "image": "recs:1", "handler": "recs:Recs", "router": {"replicas": 1, "port": 8000}}
    base.update(spec)
    return Resource("recs", "team-a", UID, generation, parse_spec(base), status or {}, spec_problem=problem)


def replica(ready=2, replicas=2, updated=None, status_replicas=None, generation=1, observed=1, conditions=()):
    return DeploymentView("recs-replica", "replica", generation, observed, replicas,
                          replicas if status_replicas is None else status_replicas, ready,
                          replicas if updated is None else updated, ready, tuple(conditions))


def router(ready=1, replicas=1):
    return DeploymentView("recs-router", "router", 1, 1, replicas, replicas, ready, replicas, ready)


def ok(generation=1):
    return Outcome(UID, generation, OK, "Reconciled")


def cond(status, ctype):
    return condition(status, ctype)


def test_all_ready():
    pods = [PodView("a", True, False, LoadedSummary(models=2, bytes=300 << 20, capacity_bytes=1 << 30)),
            PodView("b", True, False, LoadedSummary(models=2, bytes=212 << 20, capacity_bytes=1 << 30))]
    status = compute_status(resource(), [replica(), router()], pods, ok(), T0)
    assert status["replicas"] == 2 and status["readyReplicas"] == 2 and status["updatedReplicas"] == 2
    assert status["loadedModels"] == 4  # every copy across the pool
    assert status["poolBytes"] == 512 << 20 and status["poolMemory"] == "512Mi/2Gi"
    assert status["routerService"] == "recs.team-a.svc:8000"
    assert status["observedGeneration"] == 1
    assert status["selector"] == "modelplex.io/deployment=recs,modelplex.io/role=replica"
    assert cond(status, "Ready")["status"] == "True"
    assert cond(status, "Ready")["reason"] == "AllReplicasReady"
    assert cond(status, "Ready")["message"] == "2/2 replicas and 1/1 routers ready"
    assert cond(status, "Progressing")["status"] == "False"
    assert cond(status, "Degraded")["status"] == "False"
    assert all(c["lastTransitionTime"] == T0 and c["observedGeneration"] == 1 for c in status["conditions"])


def test_terminating_pods_do_not_count_models():
    pods = [PodView("a", True, False, LoadedSummary(models=1)), PodView("old", False, True, LoadedSummary(models=5))]
    assert compute_status(resource(), [replica(), router()], pods, ok(), T0)["loadedModels"] == 1


def test_not_yet_ready():
    status = compute_status(resource(), [replica(ready=1), router()], [], ok(), T0)
    assert cond(status, "Ready")["status"] == "False"
    assert cond(status, "Ready")["reason"] == "ReplicasNotReady"
    assert cond(status, "Progressing")["status"] == "True"
    assert cond(status, "Progressing")["reason"] == "ScalingUp"
    no_router = compute_status(resource(), [replica(), router(ready=0)], [], ok(), T0)
    assert cond(no_router, "Ready")["reason"] == "RouterNotReady"


def test_nothing_created_yet():
    status = compute_status(resource(), [], [], None, T0)
    assert status["replicas"] == 0 and "observedGeneration" not in status
    assert cond(status, "Ready")["status"] == "False"
    assert cond(status, "Progressing")["reason"] == "Reconciling"


def test_new_generation_not_applied_yet_is_progressing_and_still_ready():
    before = compute_status(resource(), [replica(), router()], [], ok(), T0)
    # spec.replicas 2 -> 3: the resource is at generation 2, the operator has not applied it yet.
    after = compute_status(resource(generation=2, status=before, replicas=3), [replica(), router()], [], ok(1), T1)
    assert after["observedGeneration"] == 1
    assert cond(after, "Progressing")["status"] == "True"
    assert cond(after, "Progressing")["reason"] == "Reconciling"
    assert cond(after, "Ready")["reason"] == "ReplicasNotReady"  # 2 of the 3 wanted
    assert cond(after, "Progressing")["lastTransitionTime"] == T1
    assert cond(after, "Degraded")["lastTransitionTime"] == T0  # did not flip


def test_rollout_in_progress():
    rolling = replica(ready=2, updated=1, status_replicas=3)
    status = compute_status(resource(), [rolling, router()], [], ok(), T0)
    assert cond(status, "Progressing")["reason"] == "RollingOut"
    assert cond(status, "Ready")["status"] == "True"  # maxUnavailable 0: still serving
    stale = replica(generation=2, observed=1)
    assert cond(compute_status(resource(), [stale, router()], [], ok(), T0), "Progressing")["reason"] == "Reconciling"


def test_invalid_spec():
    status = compute_status(resource(problem="spec.modelSource.uri: scheme must be one of ..."), [], [],
                            Outcome(UID, 1, INVALID, "InvalidSpec", "x"), T0)
    assert status["observedGeneration"] == 1
    for ctype, value in (("Ready", "False"), ("Progressing", "False"), ("Degraded", "True")):
        assert cond(status, ctype)["status"] == value
        assert cond(status, ctype)["reason"] == "InvalidSpec"
    assert "scheme must be one of" in cond(status, "Degraded")["message"]


def test_apply_rejected_and_retrying():
    rejected = compute_status(resource(), [], [], Outcome(UID, 1, REJECTED, "ApplyRejected", "422 Invalid"), T0)
    assert cond(rejected, "Degraded")["reason"] == "ApplyRejected"
    assert cond(rejected, "Progressing")["status"] == "False"
    assert rejected["observedGeneration"] == 1
    retrying = compute_status(resource(), [], [], Outcome(UID, 1, RETRYING, "ApplyFailed", "403 Forbidden"), T0)
    assert cond(retrying, "Degraded")["status"] == "True"
    assert cond(retrying, "Degraded")["reason"] == "ApplyFailed"
    assert cond(retrying, "Ready")["reason"] == "ApplyFailed"
    assert cond(retrying, "Progressing")["status"] == "True"
    assert "observedGeneration" not in retrying  # not done with this generation


def test_an_outcome_of_an_older_object_is_ignored():
    other = Outcome("another-uid", 1, RETRYING, "ApplyFailed", "x")
    status = compute_status(resource(), [replica(), router()], [], other, T0)
    assert cond(status, "Degraded")["status"] == "False"


def test_after_a_restart_the_operators_problem_is_kept_until_it_knows_better():
    before = compute_status(resource(), [], [], Outcome(UID, 1, RETRYING, "ApplyFailed", "403"), T0)
    restarted = compute_status(resource(status=before), [], [], None, T1)
    assert cond(restarted, "Degraded")["reason"] == "ApplyFailed"
    assert cond(restarted, "Degraded")["lastTransitionTime"] == T0


def test_deployment_trouble_is_degraded():
    failing = replica(ready=0, conditions=[("ReplicaFailure", "True", "FailedCreate", "pods are forbidden")])
    status = compute_status(resource(), [failing, router()], [], ok(), T0)
    assert cond(status, "Degraded")["reason"] == "ReplicaFailure"
    assert "pods are forbidden" in cond(status, "Degraded")["message"]
    stuck = replica(ready=1, conditions=[("Progressing", "False", "ProgressDeadlineExceeded", "took too long")])
    assert cond(compute_status(resource(), [stuck, router()], [], ok(), T0), "Degraded")["reason"] == \
        "ProgressDeadlineExceeded"


def test_scaled_to_zero():
    status = compute_status(resource(replicas=0), [replica(ready=0, replicas=0), router(ready=0)], [], ok(), T0)
    assert cond(status, "Ready")["reason"] == "ScaledToZero"
    assert cond(status, "Progressing")["status"] == "False"


def test_router_port_in_router_service():
    status = compute_status(resource(router={"replicas": 1, "port": 9100}), [], [], None, T0)
    assert status["routerService"] == "recs.team-a.svc:9100"


def test_merge_conditions_keeps_transition_times():
    old = [{"type": "Ready", "status": "True", "lastTransitionTime": T0}]
    same = merge_conditions(old, [{"type": "Ready", "status": "True"}], T1)
    assert same[0]["lastTransitionTime"] == T0
    flipped = merge_conditions(old, [{"type": "Ready", "status": "False"}], T1)
    assert flipped[0]["lastTransitionTime"] == T1


def test_transitions_post_ready_and_deployment_trouble():
    ready = compute_status(resource(), [replica(), router()], [], ok(), T0)
    assert transitions({}, ready) == [("Normal", "Ready", "2/2 replicas and 1/1 routers ready")]
    assert transitions(ready, ready) == []
    # A pod died: unready with nothing in progress -> a Warning.
    lost = compute_status(resource(status=ready), [replica(ready=1, replicas=2), router()], [], ok(), T1)
    lost_ready = condition(lost, "Ready")
    assert lost_ready["status"] == "False"
    assert condition(lost, "Progressing")["status"] == "True"  # ScalingUp back to 2: expected
    assert transitions(ready, lost) == []
    # Unready and nothing is progressing (router pods gone while the Deployment says done).
    gone = {**ready, "conditions": [
        {**condition(ready, "Ready"), "status": "False", "reason": "RouterNotReady"},
        {**condition(ready, "Progressing")},
        {**condition(ready, "Degraded")},
    ]}
    assert transitions(ready, gone) == [("Warning", "NotReady", "RouterNotReady: 2/2 replicas and 1/1 routers ready")]
    failing = compute_status(resource(status=ready), [replica(conditions=[
        ("ReplicaFailure", "True", "FailedCreate", "quota")]), router()], [], ok(), T1)
    assert ("Warning", "ReplicaFailure", "Deployment recs-replica: quota") in transitions(ready, failing)
    # The operator posts its own refusals; the keeper does not repeat them.
    invalid = compute_status(resource(status=ready, problem="bad"), [], [], None, T1)
    assert all(reason != "InvalidSpec" for _, reason, _ in transitions(ready, invalid))


def test_status_differs():
    status = compute_status(resource(), [replica(), router()], [], ok(), T0)
    assert not status_differs(status, status)
    assert not status_differs({**status, "extra": 1}, status)
    assert status_differs({**status, "loadedModels": 7}, status)
    assert status_differs({}, status)


def test_views_of_api_objects():
    pod = {
        "metadata": {"name": "p", "annotations": {ANNOTATION_LOADED_MODELS: json.dumps(
            {"version": 4, "models": 2, "loading": 0, "capacity": 3, "bytes": 0, "capacityBytes": 0})}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.244.0.7"},
    }
    assert pod_view(pod) == PodView("p", True, False, LoadedSummary(version=4, models=2, capacity=3), "10.244.0.7")
    assert pod_view({"metadata": {"name": "q", "deletionTimestamp": "x"}}) == PodView("q", False, True)
    dep = {
        "metadata": {"name": "recs-replica", "generation": 3, "labels": {"modelplex.io/role": "replica"}},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 3, "replicas": 3, "readyReplicas": 2, "updatedReplicas": 1,
                   "availableReplicas": 2,
                   "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]},
    }
    view = deployment_view(dep)
    assert view == DeploymentView("recs-replica", "replica", 3, 3, 2, 3, 2, 1, 2,
                                  (("Available", "True", "MinimumReplicasAvailable", ""),))
    assert not view.rolled_out


def test_malformed_annotations_count_as_nothing():
    for raw in ("", "not json", "[]", '{"models": "m1"}', '{"models": -1}', '{"models": ["m1"]}'):
        assert loaded_summary({ANNOTATION_LOADED_MODELS: raw}) == LoadedSummary()
    assert loaded_summary({ANNOTATION_LOADED_MODELS: '{"models": 3, "version": 9}'}).models == 3
    assert loaded_summary(None) == LoadedSummary()


def test_pool_memory_reads_as_a_kubernetes_quantity():
    assert [quantity(n) for n in (0, 512, 1536 << 20, 12 << 30, (3 << 30) // 2)] == ["0", "512", "1.5Gi", "12Gi", "1.5Gi"]


# -- per-model state: status.models from the replicas' documents ------------------------------


def test_models_list_copies_holders_and_bytes_most_copies_then_largest_first():
    from modelplex.wire.loaded import LoadedModels
    from modelplex_operator.status import model_entries

    documents = {
        "recs-replica-b": LoadedModels(models=("small", "big", "shared"),
                                       model_bytes={"small": 10, "big": 900, "shared": 50}),
        "recs-replica-a": LoadedModels(models=("shared", "unsized")),
    }
    entries, omitted = model_entries(documents)
    assert entries == [
        {"name": "shared", "copies": 2, "bytes": 50, "replicas": ["recs-replica-a", "recs-replica-b"]},
        {"name": "big", "copies": 1, "bytes": 900, "replicas": ["recs-replica-b"]},
        {"name": "small", "copies": 1, "bytes": 10, "replicas": ["recs-replica-b"]},
        {"name": "unsized", "copies": 1, "bytes": 0, "replicas": ["recs-replica-a"]},
    ]
    assert omitted == 0
    assert model_entries(documents, limit=2) == (entries[:2], 2)


def test_status_models_are_bounded_and_say_how_many_were_left_out():
    from modelplex.wire.loaded import LoadedModels
    from modelplex_operator.status import MAX_STATUS_HOLDERS, MAX_STATUS_MODELS

    names = [f"recs-replica-{i:02}" for i in range(MAX_STATUS_HOLDERS + 2)]
    documents = {name: LoadedModels(models=tuple(f"m{j}" for j in range(MAX_STATUS_MODELS + 7)),
                                    model_bytes={"m3": 1 << 20}) for name in names}
    pods = [PodView(name, True, False, LoadedSummary(models=MAX_STATUS_MODELS + 7)) for name in names]
    status = compute_status(resource(), [replica(), router()], pods, ok(), T0, documents)
    assert len(status["models"]) == MAX_STATUS_MODELS and status["modelsOmitted"] == 7
    first = status["models"][0]
    assert first["name"] == "m3" and first["copies"] == len(names) and first["bytes"] == 1 << 20
    assert first["replicas"] == names[:MAX_STATUS_HOLDERS]
    assert len(json.dumps(status)) < 64_000  # whatever the pool, the status stays small


def test_terminating_pods_and_pods_gone_do_not_list_models():
    from modelplex.wire.loaded import LoadedModels

    documents = {"a": LoadedModels(models=("m1",)), "old": LoadedModels(models=("m2",)),
                 "gone": LoadedModels(models=("m3",))}
    pods = [PodView("a", True, False), PodView("old", False, True)]
    status = compute_status(resource(), [replica(), router()], pods, ok(), T0, documents)
    assert [m["name"] for m in status["models"]] == ["m1"]


def test_pool_capacity_and_the_models_reported_condition():
    pods = [PodView("a", True, False, LoadedSummary(bytes=1, capacity_bytes=1 << 30)),
            PodView("b", True, False, LoadedSummary(bytes=2, capacity_bytes=1 << 30))]
    status = compute_status(resource(), [replica(), router()], pods, ok(), T0)
    assert status["poolCapacityBytes"] == 2 << 30 and status["models"] == [] and status["modelsOmitted"] == 0
    reported = cond(status, "ModelsReported")
    assert reported["status"] == "True" and reported["reason"] == "Reported"
    status = compute_status(resource(status=status), [replica(), router()], pods, ok(), T1,
                            unreported={"b": "no answer within 3 s", "gone": "refused"})
    reported = cond(status, "ModelsReported")
    assert reported["status"] == "False" and reported["reason"] == "ReplicaUnreachable"
    assert reported["message"] == ("GET /v1/models failed on b: no answer within 3 s "
                                   "(their last known models are shown)")
    assert reported["lastTransitionTime"] == T1
    assert cond(status, "Ready")["status"] == "True"  # serving is another matter
    # A replica that is not ready is not read: no news from it is no failure.
    unready = [pods[0], PodView("b", False, False)]
    status = compute_status(resource(status=status), [replica(), router()], unready, ok(), T1,
                            unreported={"b": "no answer within 3 s"})
    assert cond(status, "ModelsReported")["status"] == "True"
    assert transitions({}, status) == [("Normal", "Ready", "2/2 replicas and 1/1 routers ready")]


def test_what_the_spec_leaves_out_is_read_with_the_spec_modules_defaults():
    bare = Resource("recs", "team-a", UID, 1, parse_spec({"image": "recs:1", "handler": "recs:Recs"}), {})
    status = compute_status(bare, [replica(ready=1, replicas=1), router(ready=1, replicas=1)], [], ok(), T0)
    assert status["routerService"] == f"recs.team-a.svc:{DEFAULT_ROUTER_PORT}"
    assert cond(status, "Ready")["message"] == f"1/1 replicas and 1/{DEFAULT_ROUTER_REPLICAS} routers ready"
