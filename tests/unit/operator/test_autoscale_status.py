"""The status of an autoscaled deployment: the autoscaler's count is the wanted one, and a pool at
zero whose routers hold requests is ready."""

from __future__ import annotations

from modelplex.wire.spec import parse_spec
from modelplex_operator.status import DeploymentView, Outcome, Resource, compute_status, condition, transitions

UID = "uid-1"
T0 = "2026-01-01T00:00:00Z"
IMAGE = {"image": "recs:1", "handler": "recs:Recs"}
AUTOSCALING = {"minReplicas": 0, "maxReplicas": 3, "targetOngoingRequests": 2}


def autoscaled(**spec):
    return Resource("recs", "team-a", UID, 1,
                    parse_spec({**IMAGE, "autoscaling": AUTOSCALING, "router": {"replicas": 2}, **spec}), {})


def replica(ready, replicas):
    return DeploymentView("recs-replica", "replica", 1, 1, replicas, replicas, ready, replicas, ready)


def router(ready=2):
    return DeploymentView("recs-router", "router", 1, 1, 2, 2, ready, 2, ready)


OK = Outcome(UID, 1, "ok", "Reconciled")


def test_the_wanted_count_is_the_one_the_autoscaler_gave_the_replica_deployment():
    status = compute_status(autoscaled(), [replica(3, 3), router()], [], OK, T0)
    ready = condition(status, "Ready")
    assert ready["status"] == "True" and ready["message"] == "3/3 replicas and 2/2 routers ready"
    scaling_up = compute_status(autoscaled(), [replica(1, 3), router()], [], OK, T0)
    assert condition(scaling_up, "Ready")["status"] == "False"
    assert condition(scaling_up, "Progressing")["reason"] == "ScalingUp"


def test_at_zero_the_pool_is_ready_while_its_routers_are_and_going_there_warns_nobody():
    busy = compute_status(autoscaled(), [replica(1, 1), router()], [], OK, T0)
    idle = compute_status(autoscaled(), [replica(0, 0), router()], [], OK, T0)
    ready = condition(idle, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")
    assert "the next request starts a replica" in ready["message"]
    assert condition(idle, "Progressing")["status"] == "False"
    assert transitions(busy, idle) == []
    no_router = compute_status(autoscaled(), [replica(0, 0), router(ready=0)], [], OK, T0)
    assert condition(no_router, "Ready")["status"] == "False"


def test_a_fixed_pool_at_zero_serves_nothing():
    fixed = Resource("recs", "team-a", UID, 1, parse_spec({**IMAGE, "replicas": 0, "router": {"replicas": 2}}), {})
    status = compute_status(fixed, [replica(0, 0), router(ready=0)], [], OK, T0)
    assert condition(status, "Ready")["status"] == "False"
    assert condition(status, "Ready")["reason"] == "ScaledToZero"
