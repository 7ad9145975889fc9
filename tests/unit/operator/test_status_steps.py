"""The steps the status is computed in, each on its own: what the spec wants, the pool of pods,
where the reconcile stands, the problem ``Degraded`` names, and the serving conditions."""

from __future__ import annotations

from modelplex.wire.loaded import LoadedSummary
from modelplex.wire.spec import DEFAULT_ROUTER_PORT, parse_spec
from modelplex_operator.handlers.observe import read_spec
from modelplex_operator.status import (OK, RETRYING, DeploymentView, Outcome, Owned, PodView, Problem, Resource, Wanted,
                                       owned, pool_of, problem_of, reconciled, replica_counts, serving_conditions,
                                       wanted)

UID = "uid-1"
SPEC = {"image": "recs:1", "handler": "recs:Recs"}


def replica(ready=2, replicas=2, conditions=()):
    return DeploymentView("recs-replica", "replica", 1, 1, replicas, replicas, ready, replicas, ready, tuple(conditions))


def router(ready=1, replicas=1):
    return DeploymentView("recs-router", "router", 1, 1, replicas, replicas, ready, replicas, ready)


def resource(generation=1, status=None, problem=""):
    return Resource("recs", "team-a", UID, generation, parse_spec({**SPEC, "replicas": 2}), status or {},
                    spec_problem=problem)


def test_the_deployments_are_told_apart_by_their_role():
    both = owned([router(), replica()])
    assert both.replica == replica() and both.router == router()
    assert owned([]) == Owned(None, None)


def test_the_spec_wants_its_replicas_routers_port_and_declared_copies():
    spec = parse_spec({**SPEC, "replicas": 3, "router": {"replicas": 2, "port": 9100},
                       "models": [{"match": "m", "minCopies": 2}]})
    assert wanted(spec, Owned(replica(), router())) == Wanted(3, 2, 9100, False, {"m": 2})


def test_without_a_usable_spec_the_deployments_counts_are_wanted_on_the_default_port():
    assert wanted(None, Owned(replica(replicas=4), router(replicas=2))) == Wanted(4, 2, DEFAULT_ROUTER_PORT)
    assert wanted(None, Owned()) == Wanted(0, 0, DEFAULT_ROUTER_PORT)


def test_an_autoscaled_pool_wants_what_the_autoscaler_set_on_the_replica_deployment():
    spec = parse_spec({**SPEC, "autoscaling": {"minReplicas": 1, "maxReplicas": 5}})
    assert wanted(spec, Owned(replica(replicas=4), router())).replicas == 4
    assert wanted(spec, Owned(None, router())).replicas == 1  # no Deployment yet: the spec's start
    assert wanted(spec, Owned()).autoscaled


def test_the_pool_leaves_terminating_pods_out_and_sums_what_the_others_hold():
    pool = pool_of([PodView("a", True, False, LoadedSummary(models=2, bytes=1 << 30, capacity=3, capacity_bytes=2 << 30)),
                    PodView("b", False, False, LoadedSummary(models=1, bytes=1 << 29, capacity_bytes=2 << 30)),
                    PodView("c", True, True, LoadedSummary(models=5, bytes=1 << 30))])
    assert (pool.copies, pool.bytes, pool.capacity_bytes) == (3, 3 << 29, 4 << 30)
    assert pool.memory == "1.5Gi/4Gi"
    assert pool.names == {"a", "b"} and pool.ready == {"a"}
    assert pool.ready_capacities == {"a": 3}


def test_a_pool_without_budgets_shows_only_the_bytes_held():
    assert pool_of([PodView("a", True, False, LoadedSummary(bytes=2048))]).memory == "2Ki"


def test_replica_counts_come_from_the_replica_deployment_and_are_zero_without_one():
    assert replica_counts(Owned(replica(ready=1, replicas=3), router())) == {
        "replicas": 3, "readyReplicas": 1, "updatedReplicas": 3}
    assert replica_counts(Owned()) == {"replicas": 0, "readyReplicas": 0, "updatedReplicas": 0}


def test_a_final_outcome_makes_its_generation_observed_and_a_retry_does_not():
    state = reconciled(resource(generation=2, status={"observedGeneration": 1}), Outcome(UID, 2, OK))
    assert state.observed == 2 and state.caught_up and state.current == Outcome(UID, 2, OK)
    retrying = reconciled(resource(generation=2, status={"observedGeneration": 1}), Outcome(UID, 2, RETRYING))
    assert retrying.observed == 1 and not retrying.caught_up and retrying.current is not None


def test_an_outcome_of_an_earlier_object_of_the_same_name_is_ignored():
    state = reconciled(resource(), Outcome("uid-0", 1, OK))
    assert state.outcome is None and state.observed is None and not state.caught_up


def test_an_outcome_of_an_older_generation_is_not_current():
    assert reconciled(resource(generation=3), Outcome(UID, 2, RETRYING)).current is None


def test_the_spec_problem_comes_before_a_failed_reconcile_and_the_deployments_trouble():
    failing = replica(conditions=[("ReplicaFailure", "True", "FailedCreate", "quota exceeded")])
    state = reconciled(resource(), Outcome(UID, 1, RETRYING, "ApplyFailed", "403"))
    assert problem_of(resource(problem="bad"), state, Owned(failing, router())) == Problem("InvalidSpec", "bad")
    assert problem_of(resource(), state, Owned(failing, router())) == Problem("ApplyFailed", "403")
    assert problem_of(resource(), reconciled(resource(), Outcome(UID, 1, OK)), Owned(failing, router())) == \
        Problem("ReplicaFailure", "Deployment recs-replica: quota exceeded")


def test_after_a_restart_the_operators_last_problem_of_this_generation_is_kept():
    degraded = {"type": "Degraded", "status": "True", "reason": "ObjectConflict", "message": "not ours",
                "observedGeneration": 1}
    before = resource(status={"conditions": [degraded]})
    assert problem_of(before, reconciled(before, None), Owned()) == Problem("ObjectConflict", "not ours")
    newer = resource(generation=2, status={"conditions": [degraded]})
    assert problem_of(newer, reconciled(newer, None), Owned()) is None


def test_a_problem_that_blocks_the_operator_makes_it_neither_ready_nor_progressing():
    ready, progressing = serving_conditions(Wanted(2, 1, 8000), reconciled(resource(), None), Owned(),
                                            Problem("ApplyRejected", "422 Invalid"))
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "ApplyRejected", "422 Invalid")
    assert (progressing["status"], progressing["message"]) == ("False", "the operator cannot act on this spec")


def test_a_rolled_out_pool_is_ready_and_done_progressing():
    state = reconciled(resource(), Outcome(UID, 1, OK))
    ready, progressing = serving_conditions(Wanted(2, 1, 8000), state, Owned(replica(), router()), None)
    assert (ready["status"], ready["reason"]) == ("True", "AllReplicasReady")
    assert (progressing["status"], progressing["reason"]) == ("False", "RolloutComplete")
    assert ready["message"] == progressing["message"] == "2/2 replicas and 1/1 routers ready"


def test_an_autoscaled_pool_at_zero_is_ready_while_its_routers_are():
    state = reconciled(resource(), Outcome(UID, 1, OK))
    ready, _ = serving_conditions(Wanted(0, 1, 8000, autoscaled=True), state, Owned(replica(0, 0), router()), None)
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")
    fixed, _ = serving_conditions(Wanted(0, 1, 8000), state, Owned(replica(0, 0), router()), None)
    assert (fixed["status"], fixed["message"]) == ("False", "spec.replicas is 0: nothing serves")


def test_a_resource_is_parsed_once_with_the_spec_modules_defaults():
    spec, problem = read_spec({"metadata": {"name": "recs", "namespace": "team-a"}, "spec": SPEC})
    assert problem == "" and spec is not None and spec.router.port == DEFAULT_ROUTER_PORT


def test_a_spec_that_does_not_parse_reads_as_none_with_its_problem():
    spec, problem = read_spec({"metadata": {"name": "recs"}, "spec": {"image": "recs:1"}})
    assert spec is None and "modelSource is required" in problem


def test_a_name_the_cluster_refuses_still_leaves_the_spec_it_asks_with():
    spec, problem = read_spec({"metadata": {"name": "1recs"}, "spec": {**SPEC, "router": {"port": 9100}}})
    assert problem.startswith("metadata.name: must start with a letter")
    assert spec is not None and spec.router.port == 9100
