"""The routing table's index: holders per model and tiers by model count, kept as replicas change,
and decisions read from it that match the policy over the whole list."""

from __future__ import annotations

import random

from modelplex.wire.loaded import LoadedModels
from modelplex_router.events import (ConnectionFailed, ReplicaGone, ReplicaSeen, ReplicasListed, RequestFinished,
                                     RequestStarted, Unloaded)
from modelplex_router.policy import SAMPLE, Kind, Params, choose, rendezvous_score
from modelplex_router.record import Held
from modelplex_router.table import RoutingTable

PARAMS = Params(max_ongoing=4, matching_timeout_s=1.0)
NOW = 100.0


def seen(name: str, models=(), loading=(), ready=True, capacity=4, version=1) -> ReplicaSeen:
    return ReplicaSeen(name, f"http://{name}", ready,
                       Held.of(LoadedModels(version, capacity, tuple(models), tuple(loading))))


def holder_names(table: RoutingTable, model: str) -> set[str]:
    return {r.name for r in table.holders(model)}


def assert_index_matches_records(table: RoutingTable) -> None:
    """The index says exactly what a pass over every record would."""
    replicas = table.replicas()
    models = {m for r in replicas for m in r.held()}
    for model in models | {"never-seen"}:
        assert holder_names(table, model) == {r.name for r in replicas if r.holds(model)}, model
    tiers: dict[int, int] = {}
    for replica in replicas:
        if replica.ready:
            tiers[replica.model_count] = tiers.get(replica.model_count, 0) + 1
    assert table.tier_sizes() == dict(sorted(tiers.items()))


def test_a_loaded_model_files_its_replica_as_holder_and_an_eviction_unfiles_it():
    table = RoutingTable()
    table.apply(seen("a", models=["m"]), NOW)
    table.apply(seen("b"), NOW)
    assert holder_names(table, "m") == {"a"}
    assert table.tier_sizes() == {0: 1, 1: 1}
    table.apply(seen("a", models=["n"], version=2), NOW)  # m evicted, n loaded
    assert holder_names(table, "m") == set()
    assert holder_names(table, "n") == {"a"}
    assert_index_matches_records(table)


def test_a_load_reported_by_the_replica_counts_as_holding_until_it_is_loaded_or_dropped():
    table = RoutingTable()
    table.apply(seen("a", loading=["m"]), NOW)
    assert holder_names(table, "m") == {"a"}
    table.apply(seen("a", models=["m"], version=2), NOW)
    assert holder_names(table, "m") == {"a"}
    table.apply(seen("a", version=3), NOW)  # the load failed or the model was evicted
    assert holder_names(table, "m") == set()
    assert_index_matches_records(table)


def test_a_load_this_router_started_files_the_replica_and_a_failed_load_unfiles_it():
    table = RoutingTable()
    table.apply(seen("a"), NOW)
    replica = table.get("a")
    started = RequestStarted.to(replica, "m")
    assert started.for_load
    table.apply(started, NOW)
    assert holder_names(table, "m") == {"a"}
    assert table.tier_sizes() == {1: 1}
    table.apply(RequestFinished(started, ok=False), NOW)
    assert holder_names(table, "m") == set()
    assert table.tier_sizes() == {0: 1}


def test_a_successful_load_keeps_the_replica_filed_until_what_was_learned_expires():
    table = RoutingTable(learned_max_age_s=2.0)
    table.apply(seen("a"), NOW)
    started = RequestStarted.to(table.get("a"), "m")
    table.apply(started, NOW)
    table.apply(RequestFinished(started, ok=True), NOW)
    assert holder_names(table, "m") == {"a"}
    assert table.pool(NOW + 1.0).holders("m")
    # Never confirmed by discovery: after the learned age it is forgotten, index included.
    assert not table.pool(NOW + 2.5).holders("m")
    assert holder_names(table, "m") == set()
    assert_index_matches_records(table)


def test_a_model_this_router_unloaded_leaves_the_index_at_once():
    table = RoutingTable()
    table.apply(seen("a", models=["m", "n"]), NOW)
    table.apply(Unloaded(table.get("a"), "m"), NOW)
    assert holder_names(table, "m") == set()
    assert holder_names(table, "n") == {"a"}
    assert table.tier_sizes() == {1: 1}


def test_a_replica_that_leaves_is_in_no_index_and_a_request_ending_there_does_not_file_it_again():
    table = RoutingTable()
    table.apply(seen("a", models=["m"]), NOW)
    table.apply(seen("b", models=["m"]), NOW)
    gone = table.get("a")
    started = RequestStarted.to(gone, "x")
    table.apply(started, NOW)
    table.apply(ReplicaGone("a"), NOW)
    assert holder_names(table, "m") == {"b"}
    assert holder_names(table, "x") == set()
    table.apply(RequestFinished(started, ok=True), NOW)  # its answer came after it left
    table.apply(ConnectionFailed(gone), NOW)
    assert holder_names(table, "x") == set()
    assert table.tier_sizes() == {1: 1}
    # A full listing without b drops it too.
    table.apply(ReplicasListed((seen("c"),)), NOW)
    assert holder_names(table, "m") == set()
    assert table.tier_sizes() == {0: 1}
    assert_index_matches_records(table)


def test_an_unready_replica_leaves_the_tiers_and_the_pool_until_it_is_ready_again():
    table = RoutingTable()
    table.apply(seen("a", models=["m"]), NOW)
    table.apply(seen("a", models=["m"], ready=False), NOW)
    assert table.tier_sizes() == {}
    assert holder_names(table, "m") == {"a"}  # still what it holds...
    assert not table.pool(NOW)  # ...but no request goes there
    assert table.pool(NOW).holders("m") == []
    table.apply(seen("a", models=["m"]), NOW)
    assert [r.name for r in table.pool(NOW).holders("m")] == ["a"]


def test_a_quarantined_replica_is_skipped_by_the_pool_and_back_when_the_quarantine_runs_out():
    table = RoutingTable(quarantine_s=2.0)
    table.apply(seen("a", models=["m"]), NOW)
    table.apply(ConnectionFailed(table.get("a")), NOW)
    assert table.pool(NOW + 1.0).holders("m") == []
    assert [r.name for r in table.pool(NOW + 2.0).holders("m")] == ["a"]


def test_an_excluded_replica_is_skipped_by_the_pool():
    table = RoutingTable()
    table.apply(seen("a", models=["m"]), NOW)
    table.apply(seen("b", models=["m"]), NOW)
    assert [r.name for r in table.pool(NOW, {"a"}).holders("m")] == ["b"]
    assert not table.pool(NOW, {"a", "b"})


def test_the_index_matches_the_records_through_random_churn():
    rng = random.Random(7)
    table = RoutingTable(learned_max_age_s=2.0, quarantine_s=1.0)
    names = [f"r{i}" for i in range(12)]
    models = [f"m{i}" for i in range(20)]
    in_flight: list[RequestStarted] = []
    now = NOW
    for step in range(2000):
        now += rng.random() * 0.05
        action = rng.randrange(7)
        name = rng.choice(names)
        replica = table.get(name)
        if action <= 1:
            table.apply(seen(name, models=rng.sample(models, rng.randrange(4)), loading=rng.sample(models, rng.randrange(2)),
                             ready=rng.random() > 0.15, capacity=rng.choice((0, 2, 4)), version=step), now)
        elif action == 2 and replica is not None:
            started = RequestStarted.to(replica, rng.choice(models))
            table.apply(started, now)
            in_flight.append(started)
        elif action == 3 and in_flight:
            table.apply(RequestFinished(in_flight.pop(rng.randrange(len(in_flight))), ok=rng.random() > 0.3), now)
        elif action == 4 and replica is not None and replica.held():
            table.apply(Unloaded(replica, rng.choice(sorted(replica.held()))), now)
        elif action == 5 and rng.random() < 0.3:
            table.apply(ReplicaGone(name), now)
        elif action == 6 and replica is not None:
            table.apply(ConnectionFailed(replica), now)
        table.pool(now)  # lets the time-based refresh run
        assert_index_matches_records(table)


def test_a_decision_from_the_index_is_the_one_the_policy_makes_over_the_whole_list():
    rng = random.Random(3)
    for trial in range(200):
        table = RoutingTable()
        models = [f"m{i}" for i in range(6)]
        for i in range(rng.randrange(1, 30)):
            table.apply(seen(f"r{i}", models=rng.sample(models, rng.randrange(4)), ready=rng.random() > 0.1,
                             capacity=3), NOW)
            replica = table.get(f"r{i}")
            replica.in_slots = rng.randrange(PARAMS.max_ongoing + 1)
        model = rng.choice(models + ["new"])
        waited = rng.choice((0.0, 2.0))
        indexed = choose(table.pool(NOW), model, PARAMS, waited_s=waited, rng=random.Random(trial))
        listed = choose(table.usable(NOW), model, PARAMS, waited_s=waited, rng=random.Random(trial))
        if indexed is None or listed is None:
            assert indexed is listed is None
            continue
        assert indexed.kind is listed.kind
        if indexed.kind is Kind.HIT:
            assert indexed.replica.holds(model) and listed.replica.holds(model)
        else:
            assert indexed.replica is listed.replica  # the miss path is deterministic


def test_two_routers_that_see_the_same_pool_in_any_order_place_a_new_model_on_the_same_replica():
    names = [f"replica-{i}" for i in range(200)]
    placed = []
    for order in (names, list(reversed(names)), random.Random(1).sample(names, len(names))):
        table = RoutingTable()
        for name in order:
            table.apply(seen(name), NOW)
        placed.append([choose(table.pool(NOW), f"model-{k}", PARAMS).replica.name for k in range(50)])
    assert placed[0] == placed[1] == placed[2]
    assert len(set(placed[0])) > 30  # and new models spread over the pool


def test_a_miss_in_a_large_tier_picks_by_rendezvous_among_a_bounded_sample_on_the_ring():
    table = RoutingTable()
    for i in range(500):
        table.apply(seen(f"r{i}"), NOW)
    pool = table.pool(NOW)
    for model in ("a", "b", "c"):
        sample = list(next(pool.tiers(model)))[:SAMPLE]
        expected = max(sample, key=lambda r: rendezvous_score(model, r.name))
        assert choose(pool, model, PARAMS).replica is expected


def test_a_miss_skips_full_replicas_of_the_fewest_tier_and_takes_the_least_busy_beyond_it():
    table = RoutingTable()
    table.apply(seen("empty-but-full"), NOW)
    table.get("empty-but-full").in_slots = PARAMS.max_ongoing
    table.apply(seen("one", models=["x"]), NOW)
    table.get("one").in_slots = 2
    table.apply(seen("two", models=["x", "y"]), NOW)
    table.get("two").in_slots = 1
    decision = choose(table.pool(NOW), "m", PARAMS)
    assert decision.replica.name == "two" and decision.kind is Kind.MISS
