"""The one autoscaling round both drivers run (:func:`modelplex.autoscaling.plan_round`): observed
state in, decisions out, on a virtual clock."""

from __future__ import annotations

from modelplex.autoscaling import (MAX_MOVES, MAX_PRELOAD_MODELS, Autoscaler, Observed, ReplicaState, cheap_moves,
                                   distinct_costs, plan_round, preload_count)
from modelplex.wire.load import LoadReport, ReplicaLoad
from modelplex.wire.spec import DEFAULT_MAX_MODELS_PER_REPLICA, Autoscaling


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scaler(clock: VirtualClock, **fields) -> Autoscaler:
    config = {"minReplicas": 0, "maxReplicas": 4, "targetOngoingRequests": 2, "upscaleDelaySeconds": 0,
              "downscaleDelaySeconds": 10, "lookBackPeriodSeconds": 4, **fields}
    return Autoscaler(Autoscaling.model_validate(config), clock)


def report(*replicas: ReplicaLoad, queued: int = 0, **rates: float) -> LoadReport:
    return LoadReport("d", at=0.0, queued=queued, replicas=replicas, model_rates=rates)


def ready(*names: str) -> list[ReplicaState]:
    return [ReplicaState(name, ready=True) for name in names]


def rounds(autoscaler: Autoscaler, clock: VirtualClock, observed: Observed, seconds: float, tick: float = 2.0):
    """Rounds ``tick`` apart on the virtual clock until one changes the count (or ``seconds`` pass)."""
    plans = []
    end = clock.now + seconds
    while clock.now <= end:
        plans.append(plan_round(autoscaler, observed))
        if plans[-1].decision is not None and plans[-1].decision.changed:
            break
        clock.now += tick
    return plans


def test_without_a_report_nothing_changes_and_the_plan_says_why():
    clock = VirtualClock()
    plan = plan_round(scaler(clock), Observed(reports=[], routers=2, current=3, replicas=ready("a", "b", "c")))
    assert plan.decision is None and plan.heard == "0/2"
    assert plan.message == "no load report from the routers (0/2 answered): keeping 3 replicas"
    assert (plan.costs, plan.leaving, plan.moves, plan.pins, plan.hot_models) == ({}, (), (), {}, None)
    assert "no router runs yet" in plan_round(scaler(clock), Observed(reports=[], routers=0, current=0)).message


def test_a_request_held_at_zero_starts_a_replica_that_preloads_the_hottest_models():
    clock = VirtualClock()
    held = report(queued=1, **{"m-hot": 2.0, "m-warm": 1.0, "m-cold": 0.1, "m-idle": 0.0})
    plan = plan_round(scaler(clock), Observed(reports=[held], routers=1, current=0))
    assert (plan.decision.current, plan.decision.desired) == (0, 1)
    assert "waiting at zero" in plan.decision.reason
    # Nothing runs: the spec's capacity (unset: Ray's default, 3) bounds the list.
    assert plan.preload == DEFAULT_MAX_MODELS_PER_REPLICA == 3
    assert plan.hot_models == ("m-hot", "m-warm", "m-cold")
    assert (plan.leaving, plan.moves, plan.pins) == ((), (), {})


def test_the_hot_models_list_is_written_only_when_it_changes_and_an_idle_pool_keeps_it():
    clock = VirtualClock()
    autoscaler = scaler(clock, minReplicas=1)
    busy = report(ReplicaLoad("a", ongoing=1, models=("m1",)), m1=1.0, m2=0.5)
    written = plan_round(autoscaler, Observed(reports=[busy], routers=1, current=1, hot=None)).hot_models
    assert written == ("m1", "m2")
    clock.now += 2
    assert plan_round(autoscaler, Observed(reports=[busy], routers=1, current=1, hot=written)).hot_models is None
    clock.now += 2
    idle = report(ReplicaLoad("a", models=("m1",)))
    assert plan_round(autoscaler, Observed(reports=[idle], routers=1, current=1, hot=written)).hot_models is None


def test_the_number_of_preloaded_models_is_the_replicas_capacity_up_to_a_bound():
    ten_slots = report(ReplicaLoad("a", capacity=10), ReplicaLoad("b"))
    # A handler with 10 slots (its @multiplexed, as the routers report it) pre-loads MAX_PRELOAD_MODELS.
    assert preload_count(ten_slots, None) == min(10, MAX_PRELOAD_MODELS) == 4
    assert preload_count(report(ReplicaLoad("a", capacity=2)), None) == 2
    # Before any replica reports: the spec's maxModelsPerReplica, else Ray's default.
    assert preload_count(report(), 10) == MAX_PRELOAD_MODELS
    assert preload_count(report(), 1) == 1
    assert preload_count(None, None) == DEFAULT_MAX_MODELS_PER_REPLICA
    clock = VirtualClock()
    rates = {f"m{i}": float(10 - i) for i in range(8)}
    plan = plan_round(scaler(clock), Observed(reports=[report(ReplicaLoad("a", ongoing=1, capacity=10), **rates)],
                                              routers=1, current=1))
    assert plan.preload == 4 and plan.hot_models == ("m0", "m1", "m2", "m3")


def test_reports_of_several_routers_add_up():
    clock = VirtualClock()
    one = report(ReplicaLoad("a", ongoing=2, models=("m",)), m=1.0)
    two = report(ReplicaLoad("a", ongoing=3, models=("m",)), queued=1, m=1.0)
    plan = plan_round(scaler(clock), Observed(reports=[one, two], routers=3, current=1, replicas=ready("a")))
    assert plan.heard == "2/3" and plan.report.ongoing == 6
    assert plan.decision.desired == 3  # 6 ongoing at target 2
    assert plan.costs == {"a": 120}  # 2 requests/s on its only copy: 120 a minute


def test_a_scale_down_removes_the_coldest_moves_its_hot_model_and_pins_the_declared_copies_first():
    clock = VirtualClock()
    autoscaler = scaler(clock)
    load = report(
        ReplicaLoad("hot", ongoing=1, models=("m-hot", "m-shared"), capacity=4),
        ReplicaLoad("cold", ongoing=0, models=("m-warm", "m-shared", "m-pinned"), capacity=4),
        **{"m-hot": 2.0, "m-warm": 0.5, "m-shared": 1.0, "m-pinned": 0.01},
    )
    observed = Observed(reports=[load], routers=1, current=2, replicas=ready("hot", "cold") + [ReplicaState("new")],
                        declared={"m-pinned": 1})
    plans = rounds(autoscaler, clock, observed, seconds=30)
    assert [p.decision.desired for p in plans[:-1]] == [2] * (len(plans) - 1)  # downscaleDelaySeconds first
    plan = plans[-1]
    assert (plan.decision.current, plan.decision.desired) == (2, 1)
    # Every live replica gets its cost; one no router knows yet is 0 (and, not ready, goes first).
    assert plan.costs == {"hot": 150, "cold": 61, "new": 0}
    assert plan.leaving == ("new",)
    assert plan.moves == ()  # "new" holds nothing
    assert [models for models in plan.pins.values()] == [("m-pinned",)] and set(plan.pins) <= {"hot", "cold"}

    settled = Observed(reports=[load], routers=1, current=2, replicas=ready("hot", "cold"), declared={"m-pinned": 1})
    plan = rounds(scaler(clock), clock, settled, seconds=30)[-1]
    assert plan.leaving == ("cold",)
    # Only "cold" holds m-warm; m-shared has a copy on "hot"; m-pinned is pinned, not moved.
    assert plan.moves == (("m-warm", "hot"),)
    assert plan.pins == {"hot": ("m-pinned",)}  # the declared copy, on the replica that stays
    assert plan.preload == 4 and plan.hot_models == ("m-hot", "m-shared", "m-warm", "m-pinned")


def test_pods_carrying_costs_are_removed_by_those_costs_not_by_the_heat_worked_out_now():
    """A ReplicaSet removes by the pod-deletion-costs the pods carry (an earlier round's): the
    plan names the pod that goes, and the cost it went by, where the heat has since moved."""
    clock = VirtualClock()
    load = report(ReplicaLoad("a", ongoing=1, models=("m-a",), capacity=4), ReplicaLoad("b", models=("m-b",), capacity=4),
                  **{"m-a": 1.0, "m-b": 1.1})  # now: a is the colder (60 a minute against 66)
    carrying = Observed(reports=[load], routers=1, current=2,
                        replicas=[ReplicaState("a", ready=True, cost=70), ReplicaState("b", ready=True, cost=57)])
    plan = rounds(scaler(clock), clock, carrying, seconds=30)[-1]
    assert (plan.decision.current, plan.decision.desired) == (2, 1)
    assert plan.costs == {"a": 60, "b": 66}  # written for the next rounds
    assert plan.leaving == ("b",) and plan.leaving_costs == {"b": 57}
    # Local mode's replicas carry no cost: its driver removes by the heat of the round.
    local = rounds(scaler(clock), clock, Observed(reports=[load], routers=1, current=2, replicas=ready("a", "b")),
                   seconds=30)[-1]
    assert local.leaving == ("a",) and local.leaving_costs == {"a": 60}


def test_equal_heat_gets_distinct_costs_in_the_order_a_scale_down_removes_by():
    # b and c hold the same models: equal heat. The one with fewer ongoing requests is the colder.
    load = report(ReplicaLoad("a", models=("m-hot",)), ReplicaLoad("b", ongoing=2, models=("m-warm",)),
                  ReplicaLoad("c", ongoing=0, models=("m-warm",)), **{"m-hot": 2.0, "m-warm": 1.0})
    plan = plan_round(scaler(VirtualClock()), Observed(reports=[load], routers=1, current=3, replicas=ready("a", "b", "c")))
    assert plan.costs == {"a": 120, "b": 31, "c": 30}
    assert distinct_costs({"x": 5, "y": 5, "z": 6}) == {"x": 6, "y": 5, "z": 7}  # same ongoing: the later name first
    assert distinct_costs({"x": 0, "y": 2**31 - 1, "z": 2**31 - 1}) == {"x": 0, "y": 2**31 - 1, "z": 2**31 - 1}


def test_a_scale_down_where_the_pods_carry_a_tie_at_the_cut_waits_a_round_for_distinct_costs():
    """Two pods carrying the same cost: the ReplicaSet would pick one its own way, so the round
    scales nothing and its distinct costs are written; the next round removes by them."""
    clock = VirtualClock()
    autoscaler = scaler(clock)
    load = report(ReplicaLoad("a", ongoing=2, models=("m-hot",), capacity=4),
                  ReplicaLoad("b", ongoing=1, models=("m-warm",), capacity=4),
                  ReplicaLoad("c", ongoing=1, models=("m-warm",), capacity=4),
                  **{"m-hot": 2.0, "m-warm": 1.0})  # 4 ongoing at target 2: two replicas wanted
    tied = Observed(reports=[load], routers=1, current=3, replicas=[
        ReplicaState("a", True, 120), ReplicaState("b", True, 30), ReplicaState("c", True, 30)])
    plans = rounds(autoscaler, clock, tied, seconds=30)
    assert not plans[-1].decision.changed  # never, while the tie stays
    assert plans[-1].decision.reason.endswith("waiting a round for distinct pod-deletion-costs")
    assert plans[-1].leaving == () and plans[-1].moves == ()
    assert plans[-1].costs == {"a": 120, "b": 31, "c": 30}
    written = Observed(reports=[load], routers=1, current=3, replicas=[
        ReplicaState(name, True, cost) for name, cost in plans[-1].costs.items()])
    plan = plan_round(autoscaler, written)
    assert (plan.decision.current, plan.decision.desired) == (3, 2)
    assert plan.leaving == ("c",) and plan.leaving_costs == {"c": 30}
    # A tie away from the cut changes nothing: the tied pair both stay.
    one_goes = Observed(reports=[load], routers=1, current=3, replicas=[
        ReplicaState("a", True, 10), ReplicaState("b", True, 30), ReplicaState("c", True, 30)])
    assert plan_round(autoscaler, one_goes).leaving == ("a",)


def test_a_scale_down_to_zero_pins_nothing_and_a_scale_up_moves_nothing():
    clock = VirtualClock()
    idle = report(ReplicaLoad("a", models=("m",), capacity=2), m=0.5)
    plan = rounds(scaler(clock), clock, Observed(reports=[idle], routers=1, current=1, replicas=ready("a"),
                                                 declared={"m": 1}), seconds=30)[-1]
    assert (plan.decision.desired, plan.leaving, plan.moves, plan.pins) == (0, ("a",), (), {})
    busy = report(ReplicaLoad("a", ongoing=8, models=("m",)), m=3.0)
    plan = plan_round(scaler(clock), Observed(reports=[busy], routers=1, current=1, replicas=ready("a"),
                                              declared={"m": 1}))
    assert plan.decision.desired == 4 and (plan.leaving, plan.moves, plan.pins) == ((), (), {})


# -- what moves before a scale-down -----------------------------------------------------------


def test_hot_models_only_the_leaving_replica_holds_move_to_a_staying_one_with_room():
    load = report(
        ReplicaLoad("cold", models=("m-warm", "m-shared"), capacity=4),
        ReplicaLoad("hot", models=("m-hot", "m-shared"), capacity=4),
        ReplicaLoad("full", models=("x1", "x2"), capacity=2),
        **{"m-hot": 5.0, "m-warm": 0.5, "m-shared": 1.0, "x1": 3.0, "x2": 3.0},
    )
    # m-shared has a copy on "hot": nothing to do for it; "full" has no room.
    assert cheap_moves(load, ["cold"]) == [("m-warm", "hot")]
    # Two leave at once: a copy on the other leaving replica counts for nothing.
    assert cheap_moves(load, ["cold", "hot"]) == []  # the only staying replica is full
    # Bounded: at most MAX_MOVES loads before a scale-down.
    many = report(ReplicaLoad("cold", models=tuple(f"m{i}" for i in range(5)), capacity=8),
                  ReplicaLoad("hot", models=(), capacity=8), **{f"m{i}": float(i + 1) for i in range(5)})
    assert cheap_moves(many, ["cold"]) == [("m4", "hot"), ("m3", "hot")][:MAX_MOVES]


def test_models_nobody_asks_for_stay_where_they_are():
    load = report(ReplicaLoad("cold", models=("idle",), capacity=4), ReplicaLoad("hot", capacity=4))
    assert cheap_moves(load, ["cold"]) == []
