"""The autoscaling decision on a fake clock, the load report's JSON, and the cache-aware choices."""

from __future__ import annotations

import random

import pytest

from modelplex.autoscaling import (Autoscaler, ReplicaState, deletion_costs, hottest_models, leaving_replicas, merge,
                                   rehome)
from modelplex.wire.load import LoadReport, ReplicaLoad, format_hot_models, parse_hot_models
from modelplex.wire.spec import Autoscaling, parse_spec


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def config(**fields) -> Autoscaling:
    defaults = {"minReplicas": 1, "maxReplicas": 5, "targetOngoingRequests": 2,
                "upscaleDelaySeconds": 30, "downscaleDelaySeconds": 600, "lookBackPeriodSeconds": 10}
    return Autoscaling.model_validate({**defaults, **fields})


def run(scaler: Autoscaler, clock: FakeClock, current: int, seconds: float, ongoing, queued=0):
    """Tick once a second for ``seconds``, applying each decision; the decisions."""
    decisions = []
    for _ in range(int(seconds)):
        clock.now += 1.0
        load = ongoing() if callable(ongoing) else ongoing
        scaler.observe(load, queued)
        decision = scaler.decide(current)
        current = decision.desired
        decisions.append(decision)
    return decisions


# -- the decision ---------------------------------------------------------------------------


def test_sustained_load_scales_up_once_the_upscale_delay_has_passed():
    clock = FakeClock()
    scaler = Autoscaler(config(), clock)
    run(scaler, clock, 1, 60, 0.5)  # settled at 1
    decisions = run(scaler, clock, 1, 60, 8)  # 8 ongoing at target 2: 4 replicas
    first_up = next(i for i, d in enumerate(decisions) if d.changed)
    # The 10 s average reaches 8 after 10 s; 4 must then be wanted 30 s in a row.
    assert 30 <= first_up + 1 <= 42
    assert decisions[first_up].desired == 4 and decisions[first_up].direction == "up"
    assert "target 2 per replica" in decisions[first_up].reason
    assert not any(d.changed for d in decisions[first_up + 1:])  # and stays there
    waiting = decisions[first_up - 1]
    assert not waiting.changed and "waiting out upscaleDelaySeconds" in waiting.reason


def test_load_goes_away_scales_down_only_after_the_downscale_delay():
    clock = FakeClock()
    scaler = Autoscaler(config(), clock)
    up = run(scaler, clock, 1, 120, 8)
    assert up[-1].desired == 4
    down = run(scaler, clock, 4, 700, 1)  # 1 ongoing: 1 replica
    changes = [i for i, d in enumerate(down) if d.changed]
    # Nothing for 600 s; then down in steps, as the average's fall leaves the window.
    assert 600 <= changes[0] + 1 <= 615 and changes[-1] + 1 <= 625
    assert all(down[i].direction == "down" for i in changes)
    assert down[-1].desired == 1 and "for 600 s" in down[changes[-1]].reason


def test_a_noisy_signal_does_not_flap():
    clock = FakeClock()
    scaler = Autoscaler(config(lookBackPeriodSeconds=5), clock)
    rng = random.Random(7)
    run(scaler, clock, 2, 700, 4)  # settled at 2 (4 ongoing, target 2)
    # Bursts and lulls around the same mean: 0 to 8 ongoing from one second to the next.
    decisions = run(scaler, clock, 2, 1800, lambda: rng.choice([0, 1, 4, 7, 8]))
    changes = [d for d in decisions if d.changed]
    assert len(changes) <= 1  # at most one step to the level the noise settles at
    assert all(d.direction == "up" for d in changes)


def test_a_dip_shorter_than_the_downscale_delay_changes_nothing():
    clock = FakeClock()
    scaler = Autoscaler(config(downscaleDelaySeconds=60), clock)
    run(scaler, clock, 3, 100, 6)
    decisions = run(scaler, clock, 3, 50, 0) + run(scaler, clock, 3, 100, 6)
    assert not any(d.changed for d in decisions)


def test_bounds_are_respected():
    clock = FakeClock()
    scaler = Autoscaler(config(minReplicas=2, maxReplicas=3, upscaleDelaySeconds=0, downscaleDelaySeconds=0), clock)
    assert run(scaler, clock, 2, 30, 100)[-1].desired == 3  # 50 wanted, 3 at most
    assert run(scaler, clock, 3, 30, 0)[-1].desired == 2  # idle, 2 at least
    # A count outside the bounds (spec edited) comes back at once.
    scaler.observe(4)
    assert scaler.decide(0).desired == 2 and "below minReplicas" in scaler.decide(0).reason
    assert scaler.decide(7).desired == 3 and "above maxReplicas" in scaler.decide(7).reason


def test_a_request_at_zero_replicas_starts_one_at_once_and_idle_goes_back_to_zero():
    clock = FakeClock()
    scaler = Autoscaler(config(minReplicas=0, downscaleDelaySeconds=20), clock)
    idle = run(scaler, clock, 0, 60, 0)
    assert all(d.desired == 0 and not d.changed for d in idle)
    clock.now += 1
    scaler.observe(1, queued=1)  # one request held by a router
    decision = scaler.decide(0)
    assert decision.desired == 1 and decision.queued == 1
    assert "1 request(s) waiting at zero replicas" in decision.reason
    after = run(scaler, clock, 1, 5, 1) + run(scaler, clock, 1, 60, 0)
    to_zero = next(i for i, d in enumerate(after) if d.changed)
    # The 10 s average empties, then 20 s of wanting none.
    assert after[to_zero].desired == 0 and "idle for 20 s" in after[to_zero].reason
    assert 5 + 20 <= to_zero + 1 <= 5 + 10 + 20 + 2


def test_a_burst_at_zero_starts_as_many_replicas_as_it_wants_at_once():
    clock = FakeClock()
    scaler = Autoscaler(config(minReplicas=0, lookBackPeriodSeconds=1, upscaleDelaySeconds=300), clock)
    scaler.observe(7, queued=7)
    decision = scaler.decide(0)
    assert decision.desired == 4 and "7 request(s) waiting at zero replicas" in decision.reason


def test_no_upscale_before_the_first_delay_has_been_watched():
    clock = FakeClock()
    scaler = Autoscaler(config(upscaleDelaySeconds=30), clock)
    decisions = run(scaler, clock, 1, 29, 50)
    assert not any(d.changed for d in decisions)


def test_without_reports_nothing_changes():
    clock = FakeClock()
    scaler = Autoscaler(config(minReplicas=0, downscaleDelaySeconds=5), clock)
    run(scaler, clock, 2, 30, 4)
    clock.now += 600  # the routers went silent: no evidence of idleness
    decision = scaler.decide(2)
    assert decision.desired == 2 and "no load report in the last 10 s" in decision.reason


def test_decision_reports_its_inputs():
    clock = FakeClock()
    scaler = Autoscaler(config(lookBackPeriodSeconds=4), clock)
    for load in (2, 4, 6, 8):
        clock.now += 1
        scaler.observe(load, queued=3)
    decision = scaler.decide(1)
    assert decision.average_ongoing == 5.0 and decision.queued == 3 and decision.current == 1
    assert scaler.wanted(5.0) == 3 and scaler.wanted(0) == 1 and scaler.wanted(100) == 5


# -- the report -------------------------------------------------------------------------------


def report(*replicas, queued=0, rates=None, router="r") -> LoadReport:
    return LoadReport(deployment="recs", at=1.5, queued=queued, replicas=tuple(replicas),
                      model_rates=rates or {}, router=router)


def test_a_report_goes_through_json_unchanged():
    original = report(ReplicaLoad("a", ongoing=3, models=("m1", "m2"), capacity=3),
                      ReplicaLoad("b", ongoing=0, ready=False), queued=2, rates={"m1": 0.5})
    again = LoadReport.from_json(original.to_json())
    assert again == original and again.ongoing == 5


@pytest.mark.parametrize(("body", "message"), [
    (b"[]", "must be an object"),
    (b'{"at": 1}', "deployment: required"),
    (b'{"deployment": "d", "at": 1, "queued": -1}', "queued: must be a count"),
    (b"nope", "not JSON"),
])
def test_a_bad_report_is_a_clear_error(body, message):
    with pytest.raises(ValueError, match=message):
        LoadReport.from_json(body)


def test_reports_of_several_routers_add_up():
    one = report(ReplicaLoad("a", 2, models=("m1",)), ReplicaLoad("b", 1), queued=1, rates={"m1": 1.0})
    two = report(ReplicaLoad("a", 1, models=("m2",)), queued=2, rates={"m1": 0.5, "m2": 2.0}, router="s")
    merged = merge([one, two])
    assert merged.replica("a").ongoing == 3 and merged.replica("a").models == ("m1", "m2")
    assert merged.replica("b").ongoing == 1
    assert merged.queued == 3 and merged.ongoing == 7
    assert merged.model_rates == {"m1": 1.5, "m2": 2.0}


# -- the cache-aware choices ------------------------------------------------------------------


def test_the_coldest_cache_is_removed_first():
    state = report(
        ReplicaLoad("a", models=("popular",)),
        ReplicaLoad("b", models=("popular", "rare")),
        ReplicaLoad("c", models=("rare", "never")),
        ReplicaLoad("d", models=("niche",)),
        rates={"popular": 10.0, "rare": 0.2, "niche": 3.0},
    )
    # popular's 10/s is shared by two copies: 300/min each; rare's 0.2/s by two: 6/min; niche,
    # held by d alone, 180/min: losing d loses its only copy.
    assert deletion_costs(state) == {"a": 300, "b": 306, "c": 6, "d": 180}
    costs = deletion_costs(state)
    ready = [ReplicaState(name, ready=True) for name in "abcd"]
    assert leaving_replicas(ready, costs, 4, state) == ["c", "d", "a", "b"]
    # A replica no router knows yet is cold; one not ready goes before any ready one.
    assert leaving_replicas([*ready[:2], ReplicaState("gone", ready=True)], costs, 3, state) == ["gone", "a", "b"]
    assert leaving_replicas([*ready, ReplicaState("starting")], costs, 2, state) == ["starting", "c"]


def test_the_hottest_models_per_copy_are_preloaded():
    state = report(
        ReplicaLoad("a", models=("everywhere", "solo")),
        ReplicaLoad("b", models=("everywhere",)),
        rates={"everywhere": 6.0, "solo": 4.0, "nowhere": 1.0, "idle": 0.0},
    )
    assert hottest_models(state) == ["solo", "everywhere", "nowhere"]  # 4/1 > 6/2 > 1/1
    assert hottest_models(state, limit=2) == ["solo", "everywhere"]


def test_a_hot_model_only_the_leaving_replica_holds_is_loaded_elsewhere_first():
    state = report(
        ReplicaLoad("leaving", models=("only-here", "cold-only-here", "both")),
        ReplicaLoad("full", models=("both", "x"), capacity=2),
        ReplicaLoad("roomy", models=("y",), capacity=3),
        rates={"only-here": 5.0, "cold-only-here": 0.01, "both": 9.0, "x": 1.0, "y": 1.0},
    )
    assert rehome(state, "leaving", min_rate=0.1) == [("only-here", "roomy")]
    assert rehome(report(ReplicaLoad("alone", models=("m",)), rates={"m": 1.0}), "alone") == []


def test_hot_models_file_round_trips():
    text = format_hot_models(["m1", "m2"])
    assert text == "m1\nm2\n"
    assert parse_hot_models(text + "\n# a comment\nm1\n  m3 \n") == ["m1", "m2", "m3"]


# -- the spec ---------------------------------------------------------------------------------

BASE = {"image": "img", "handler": "app:Model"}


def test_autoscaling_defaults_are_ray_serves():
    scaling = parse_spec({**BASE, "autoscaling": {}}).autoscaling
    assert (scaling.min_replicas, scaling.max_replicas, scaling.initial_replicas) == (1, 1, None)
    assert scaling.target_ongoing_requests == 2.0
    assert (scaling.upscale_delay_seconds, scaling.downscale_delay_seconds) == (30.0, 600.0)
    assert scaling.look_back_period_seconds == 30.0


def test_starting_replicas():
    assert parse_spec(BASE).starting_replicas == 1
    assert parse_spec({**BASE, "replicas": 3}).starting_replicas == 3
    assert parse_spec({**BASE, "autoscaling": {"minReplicas": 0, "maxReplicas": 3}}).starting_replicas == 0
    assert parse_spec({**BASE, "autoscaling": {"maxReplicas": 3, "initialReplicas": 2}}).starting_replicas == 2


# -- serve.deployment(autoscaling_config=...) -------------------------------------------------


def test_ray_autoscaling_config_becomes_spec_autoscaling():
    from modelplex import serve
    from modelplex.serve.graph import manifest, walk

    @serve.deployment(autoscaling_config={"min_replicas": 0, "max_replicas": 3, "target_ongoing_requests": 2,
                                          "upscale_delay_s": 5, "downscale_delay_s": 60, "metrics_interval_s": 2})
    class Scaled:
        def __call__(self, body):
            return body

    document = manifest(walk(Scaled.bind())[0], image="img", handler="app:Scaled")
    assert "replicas" not in document["spec"]
    assert document["spec"]["autoscaling"] == {"minReplicas": 0, "maxReplicas": 3, "targetOngoingRequests": 2,
                                               "upscaleDelaySeconds": 5, "downscaleDelaySeconds": 60}
    scaling = parse_spec(document["spec"]).autoscaling  # what the operator accepts
    assert (scaling.min_replicas, scaling.max_replicas, scaling.downscale_delay_seconds) == (0, 3, 60)

    auto = manifest(walk(Scaled.options(num_replicas="auto", autoscaling_config=None).bind())[0],
                    image="img", handler="app:Scaled")
    assert auto["spec"]["autoscaling"] == {"maxReplicas": 100}
    fixed = manifest(walk(Scaled.options(num_replicas=2).bind())[0], image="img", handler="app:Scaled")
    assert fixed["spec"]["replicas"] == 2 and "autoscaling" not in fixed["spec"]


def test_bad_autoscaling_config_is_named():
    from modelplex import serve

    with pytest.raises(TypeError, match="unsupported autoscaling_config key.*max_replica\\b"):
        serve.deployment(autoscaling_config={"max_replica": 3})
    with pytest.raises(ValueError, match="num_replicas and autoscaling_config both set"):
        serve.deployment(num_replicas=2, autoscaling_config={"max_replicas": 3})
