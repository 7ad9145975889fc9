"""The operator's own autoscaling pieces: pods as the round sees them, cost patches, status, Events (the
round itself: tests/unit/test_autoscaling_round.py)."""

from __future__ import annotations

from modelplex.autoscaling import ReplicaState, ScaleDecision
from modelplex_operator import scaling
from modelplex_operator.scaling import ReplicaPod


def pods(**costs):
    return [ReplicaPod(name, ip=f"10.0.0.{i}", ready=True, cost=cost) for i, (name, cost) in enumerate(costs.items())]


def test_a_replica_pod_from_the_api():
    pod = scaling.replica_pod({
        "metadata": {"name": "r-1", "annotations": {"controller.kubernetes.io/pod-deletion-cost": "42"}},
        "status": {"podIP": "10.1.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
    })
    assert pod == ReplicaPod("r-1", "10.1.0.7", True, 42)
    fresh = scaling.replica_pod({"metadata": {"name": "r-2", "annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "junk"}}, "status": {}})
    assert fresh == ReplicaPod("r-2", "", False, None)
    assert pod.state() == ReplicaState("r-1", True, 42)


def test_missing_costs_are_written_and_small_drifts_are_not():
    assert scaling.cost_patches(pods(a=None, b=None), {"a": 120, "b": 0}) == {"a": "120", "b": "0"}
    # 120 -> 126 and 0 -> 3: the same order, within the slack: no patch.
    assert scaling.cost_patches(pods(a=120, b=0), {"a": 126, "b": 3}) == {}
    # A real change of one pod's heat is written.
    assert scaling.cost_patches(pods(a=120, b=0), {"a": 300, "b": 0}) == {"a": "300"}


def test_a_change_of_order_rewrites_every_changed_cost_however_small():
    # b was colder than a; now a is (by a little): both move, so the ReplicaSet sees the new order.
    assert scaling.cost_patches(pods(a=100, b=98), {"a": 97, "b": 99}) == {"a": "97", "b": "99"}


def test_two_pods_carrying_the_same_cost_are_written_apart_however_small_the_change():
    # The ReplicaSet would break a 74-74 tie its own way: b's 75, within the slack, is written.
    assert scaling.cost_patches(pods(a=74, b=74, c=90), {"a": 74, "b": 75, "c": 90}) == {"b": "75"}


def test_the_status_block_and_the_event_carry_the_inputs():
    block = scaling.autoscaling_status(
        desired=3, current=1, average_ongoing=7.46, queued=2, routers="2/2",
        replicas=[("r-b", 4, 120), ("r-a", 3, 0)],
        last_scale=scaling.LastScale("2026-11-23T16:00:00Z", "7.46 ongoing"), message="7.46 ongoing",
    )
    assert block == {
        "desiredReplicas": 3, "currentReplicas": 1, "ongoingRequests": 7.5, "queuedRequests": 2,
        "routers": "2/2",
        "replicas": [{"name": "r-a", "ongoingRequests": 3, "deletionCost": 0},
                     {"name": "r-b", "ongoingRequests": 4, "deletionCost": 120}],
        "message": "7.46 ongoing",
        "lastScaleTime": "2026-11-23T16:00:00Z", "lastScaleReason": "7.46 ongoing",
    }
    assert "lastScaleTime" not in scaling.autoscaling_status(
        desired=0, current=0, average_ongoing=0, queued=0, routers="0/2", replicas=[], last_scale=None, message="")

    up = ScaleDecision(3, 1, "7.46 ongoing requests on average", 7.46, 2, 10.0)
    etype, reason, message = scaling.scale_event(up, "2/2")
    assert (etype, reason) == ("Normal", "ScaledUp")
    assert "replicas 1 -> 3" in message and "7.46 on average" in message and "2 queued" in message
    assert "2/2 routers" in message
    down = scaling.scale_event(ScaleDecision(0, 1, "idle for 10 s", 0.0, 0, 20.0), "1/2", {"r-a": 57})
    assert down[1] == "ScaledDown" and down[2].endswith("the coldest caches go: r-a (cost 57)"), down


def test_the_condition_keeps_its_transition_time_until_it_flips():
    first = scaling.autoscaling_condition(True, "ReadingLoad", "ok", 1, None, "t1")
    assert first["lastTransitionTime"] == "t1" and first["status"] == "True" and first["type"] == "Autoscaling"
    same = scaling.autoscaling_condition(True, "ReadingLoad", "ok", 1, first, "t2")
    assert same["lastTransitionTime"] == "t1"
    flipped = scaling.autoscaling_condition(False, "NoLoadReport", "0/2 answered", 1, same, "t3")
    assert flipped["lastTransitionTime"] == "t3" and flipped["reason"] == "NoLoadReport"

