"""The routing policy (DESIGN.md, "Routing"), tier by tier, on plain replica objects."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from modelplex.wire.loaded import LoadedModels
from modelplex_router.policy import Kind, Params, choose, choose_random, place, rendezvous_score, two_choices
from modelplex_router.record import Replica

PARAMS = Params(max_ongoing=4, matching_timeout_s=1.0)


def rep(name: str, models=(), inflight: int = 0, capacity: int = 4, loading=()) -> Replica:
    replica = Replica(name=name, url=f"http://{name}", ready=True, document=LoadedModels(models=tuple(models)),
                      capacity=capacity, in_slots=inflight)
    for model in loading:
        replica.pending[model] = 1
    return replica


def pick(replicas, model, *, waited=0.0, params=PARAMS, seed=0):
    return choose(replicas, model, params, waited_s=waited, rng=random.Random(seed))


# -- tier 1: holders first -------------------------------------------------------------------


def test_a_holder_with_room_wins_over_an_emptier_replica():
    holder = rep("a", models={"m", "x", "y"}, inflight=3)
    empty = rep("b")
    for seed in range(20):
        decision = pick([empty, holder], "m", seed=seed)
        assert decision.replica is holder
        assert decision.kind is Kind.HIT


def test_two_choices_prefers_the_less_busy_holder():
    busy = rep("a", models={"m"}, inflight=3)
    idle = rep("b", models={"m"}, inflight=0)
    # With two holders both are always drawn, so the less busy one always wins.
    assert {pick([busy, idle], "m", seed=s).replica.name for s in range(20)} == {"b"}


def test_two_choices_spreads_over_equally_busy_holders():
    replicas = [rep(n, models={"m"}) for n in "abcd"]
    rng = random.Random(1)
    counts = Counter(two_choices(replicas, rng).name for _ in range(400))
    assert set(counts) == set("abcd")
    assert min(counts.values()) > 50


def test_a_replica_loading_the_model_counts_as_a_holder():
    loading = rep("a", loading={"m"}, inflight=1)
    empty = rep("b")
    decision = pick([empty, loading], "m")
    assert decision.replica is loading
    assert decision.kind is Kind.HIT


# -- tier 2: a new model goes to the replica with the fewest models ---------------------------


def test_a_new_model_goes_to_the_replica_with_fewest_models():
    full = rep("a", models={"x", "y", "z"})
    light = rep("b", models={"w"}, inflight=3)
    decision = pick([full, light], "m")
    assert decision.replica is light
    assert decision.kind is Kind.MISS


def test_ties_are_broken_by_a_stable_hash_of_the_model():
    names = ["r0", "r1", "r2", "r3"]
    for model in (f"model-{i}" for i in range(30)):
        chosen = set()
        for seed in range(5):
            replicas = [rep(n) for n in names]
            random.Random(seed).shuffle(replicas)  # order and randomness must not matter
            chosen.add(pick(replicas, model, seed=seed).replica.name)
        assert len(chosen) == 1, model
        expected = max(names, key=lambda n: rendezvous_score(model, n))
        assert chosen == {expected}


def test_the_stable_hash_spreads_new_models_over_replicas():
    names = ["r0", "r1"]
    counts = Counter(pick([rep(n) for n in names], f"m{i}").replica.name for i in range(200))
    assert counts["r0"] > 60 and counts["r1"] > 60


def test_the_stable_hash_agrees_across_processes():
    # Python's hash() is salted per process; routers must agree across processes and restarts.
    script = (
        "from modelplex_router.policy import rendezvous_score as s;"
        "print(' '.join(max(['r0','r1','r2'], key=lambda n: s(f'm{i}', n)) for i in range(40)))"
    )
    here = " ".join(max(["r0", "r1", "r2"], key=lambda n: rendezvous_score(f"m{i}", n)) for i in range(40))
    for seed in ("1", "2"):
        there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        assert there == here


def test_model_counts_are_capped_at_capacity_so_full_replicas_tie():
    # The router may know of more models than fit (some were evicted since); both are full.
    known_more = rep("a", models={"p", "q", "r"}, capacity=2)
    known_less = rep("b", models={"s", "t"}, capacity=2)
    assert known_more.model_count == known_less.model_count == 2
    expected = max(["a", "b"], key=lambda n: rendezvous_score("m", n))
    assert pick([known_more, known_less], "m").replica.name == expected


def test_when_the_fewest_models_replica_is_full_any_with_room_takes_it():
    light_but_full = rep("a", inflight=4)
    heavy = rep("b", models={"x", "y"}, inflight=1)
    heavier = rep("c", models={"x", "y", "z"}, inflight=2)
    decision = pick([light_but_full, heavy, heavier], "m")
    assert decision.replica is heavy  # tier 3: the least busy with room
    assert decision.kind is Kind.MISS


def test_place_returns_none_when_the_fewest_models_replicas_are_full():
    assert place([rep("a", inflight=4), rep("b", models={"x"})], "m", 4) is None


# -- hot-model spread and the matching timeout -----------------------------------------------


def test_a_hot_model_spreads_to_one_more_replica_when_its_holders_are_full():
    holder = rep("a", models={"m"}, inflight=4)
    other = rep("b", models={"x"})
    third = rep("c", models={"x", "y"})
    decision = pick([holder, other, third], "m")
    assert decision.replica is other  # the fewest models among the non-holders
    assert decision.kind is Kind.FALLBACK


def test_no_spread_to_a_busy_replica_before_the_timeout():
    # Every replica is busy: spreading would only add a load. Wait for a holder instead.
    holder = rep("a", models={"m"}, inflight=4)
    busy = rep("b", models={"x"}, inflight=3)
    assert pick([holder, busy], "m", waited=0.5) is None
    decision = pick([holder, busy], "m", waited=1.0)
    assert decision.replica is busy and decision.kind is Kind.FALLBACK
    half = rep("c", models={"x"}, inflight=2)
    assert pick([holder, half], "m").replica is half


def test_waiting_for_a_load_takes_no_slot_of_the_loaded_models():
    # Every slot of "a" is taken, yet a request for the model it loads joins that load's queue,
    # and a request for a model it holds still gets a slot once one frees: neither waits on the other.
    loading = rep("a", models={"x"}, loading={"m"}, inflight=4)
    other = rep("b")
    assert pick([loading, other], "m").replica is loading
    loading.pending["m"] = 3
    loading.in_slots = 3
    assert pick([loading, other], "x").replica is loading


def test_a_load_whose_queue_is_full_is_waited_for_and_never_started_elsewhere():
    hung = rep("a", loading={"m"})
    hung.pending["m"] = PARAMS.max_ongoing
    other = rep("b")
    for waited in (0.0, 0.99, 1.0, 60.0):
        assert pick([hung, other], "m", waited=waited) is None
    # Another model still goes anywhere.
    assert pick([hung, other], "n").replica in (hung, other)


def test_no_spread_while_a_holder_is_still_loading_the_model_until_the_timeout():
    loaded = rep("a", models={"m"}, inflight=4)
    loading = rep("b", loading={"m"})
    loading.pending["m"] = PARAMS.max_ongoing
    other = rep("c")
    assert pick([loaded, loading, other], "m", waited=0.0) is None
    assert pick([loaded, loading, other], "m", waited=0.99) is None
    decision = pick([loaded, loading, other], "m", waited=1.0)
    assert decision.replica is other
    assert decision.kind is Kind.FALLBACK


def test_without_hot_spread_full_holders_are_waited_for_until_the_matching_timeout():
    params = Params(max_ongoing=4, matching_timeout_s=0.5, hot_spread=False)
    holder = rep("a", models={"m"}, inflight=4)
    other = rep("b")
    assert pick([holder, other], "m", waited=0.2, params=params) is None
    assert pick([holder, other], "m", waited=0.5, params=params).replica is other


def test_a_holder_with_room_is_used_even_past_the_timeout():
    holder = rep("a", models={"m"}, inflight=3)
    other = rep("b")
    assert pick([holder, other], "m", waited=5.0).replica is holder


# -- full replicas and requests without a model ----------------------------------------------


def test_nothing_is_chosen_when_every_replica_is_full():
    replicas = [rep("a", models={"m"}, inflight=4), rep("b", inflight=4)]
    assert pick(replicas, "m", waited=10.0) is None
    assert pick(replicas, "new", waited=10.0) is None
    assert pick(replicas, "") is None


def test_a_request_without_a_model_goes_to_the_least_busy_replica():
    replicas = [rep("a", inflight=2), rep("b", inflight=1), rep("c", inflight=3)]
    for seed in range(10):
        decision = pick(replicas, "", seed=seed)
        assert decision.replica.name == "b"
        assert decision.kind is Kind.ANY


def test_no_replicas_no_decision():
    assert pick([], "m") is None
    assert pick([], "") is None


@pytest.mark.parametrize("model", ["m", ""])
def test_random_policy_only_uses_replicas_with_room(model):
    replicas = [rep("a", models={"m"}, inflight=4), rep("b"), rep("c", models={"m"})]
    chosen = Counter()
    for seed in range(100):
        decision = choose_random(replicas, model, PARAMS, rng=random.Random(seed))
        chosen[decision.replica.name] += 1
        if model:
            assert decision.kind is (Kind.HIT if decision.replica.name == "c" else Kind.MISS)
    assert set(chosen) == {"b", "c"}
