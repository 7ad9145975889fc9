"""The routing table and the scheduler: loading bookkeeping, learned models, quarantine, bounds."""

from __future__ import annotations

import asyncio
import random

import pytest

from modelplex.wire.errors import NotReady, Overloaded
from modelplex.wire.loaded import LoadedModels, LoadedSummary
from modelplex_router.events import (Answered, ConnectionFailed, DocumentFetched, ReplicaGone, ReplicaSeen,
                                     ReplicasListed, RequestFinished, RequestStarted, SummaryHeard, Unloaded)
from modelplex_router.policy import Kind, Params
from modelplex_router.record import Held
from modelplex_router.scheduler import Scheduler
from modelplex_router.table import Change, RoutingTable

# On looptime's virtual clock: waits and timeouts cost no real time.
pytestmark = pytest.mark.looptime


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def info(name: str, models=(), ready=True, capacity=2, loading=(), version=1) -> ReplicaSeen:
    return ReplicaSeen(name, f"http://{name}", ready, Held.of(LoadedModels(version, capacity, tuple(models),
                                                                            tuple(loading))))


@pytest.fixture
def clock():
    return FakeClock()


def make(clock, *names, lag_s=0.0, max_ongoing=4, **kwargs):
    scheduler = Scheduler(Params(max_ongoing=max_ongoing, matching_timeout_s=1.0), lag_s=lag_s, clock=clock,
                          rng=random.Random(0), deployment="d", **kwargs)
    table = scheduler.table
    for name in names:
        table.apply(info(name), clock())
    return table, scheduler


# -- loading bookkeeping ---------------------------------------------------------------------


def test_a_burst_for_a_new_model_loads_it_on_one_replica(clock):
    table, scheduler = make(clock, "a", "b", "c", max_ongoing=16)
    leases = [scheduler.try_acquire("m") for _ in range(12)]
    assert {lease.replica.name for lease in leases} == {leases[0].replica.name}
    assert leases[0].kind is Kind.MISS
    assert all(lease.kind is Kind.HIT for lease in leases[1:])
    replica = leases[0].replica
    assert replica.is_loading("m") and replica.holds("m") and not replica.loaded("m")
    assert replica.to_dict()["loading"] == ["m"]


def test_a_success_marks_the_model_loaded_and_clears_loading(clock):
    table, scheduler = make(clock, "a", "b")
    first, second = scheduler.try_acquire("m"), scheduler.try_acquire("m")
    replica = first.replica
    first.release(ok=True)
    assert replica.loaded("m") and not replica.is_loading("m")
    second.release(ok=True)
    assert replica.pending == {} and replica.inflight == 0
    assert replica.to_dict()["models"] == ["m"]


def test_a_failed_request_leaves_nothing_loaded_or_loading(clock):
    table, scheduler = make(clock, "a", "b")
    lease = scheduler.try_acquire("m")
    lease.release(ok=False)
    lease.release(ok=False)  # releasing twice is harmless
    assert not lease.replica.holds("m")
    assert lease.replica.inflight == 0


def test_the_replicas_own_loading_list_counts_as_holding(clock):
    table, scheduler = make(clock, "a", "b")
    table.apply(info("b", loading=["m"]), clock())
    lease = scheduler.try_acquire("m")
    assert lease.replica.name == "b" and lease.kind is Kind.HIT


# -- what the router learned vs. what discovery says -----------------------------------------


def test_a_later_snapshot_overrides_what_was_learned(clock):
    table, scheduler = make(clock, "a")
    table.apply(info("a", models=["m"]), clock())
    lease = scheduler.try_acquire("n")
    clock.advance(0.01)
    lease.release(ok=True)
    replica = table.get("a")
    assert replica.loaded("n")
    # A poll that started before the success does not know of it yet: keep what we learned.
    table.apply(info("a", models=["m"]), clock() - 0.005)
    assert replica.loaded("n")
    # A poll that started after it is the truth (n was evicted since, say).
    clock.advance(0.1)
    table.apply(info("a", models=["m"]), clock())
    assert not replica.loaded("n")
    assert table.snapshot()[0]["models"] == ["m"]


def test_with_a_lagging_source_learned_models_survive_early_snapshots(clock):
    table, scheduler = make(clock, "a", lag_s=1.0)
    lease = scheduler.try_acquire("n")
    lease.release(ok=True)
    clock.advance(0.5)
    table.apply(info("a"), clock())
    assert table.get("a").loaded("n")
    clock.advance(0.6)
    table.apply(info("a"), clock())
    assert not table.get("a").loaded("n")


def test_learned_models_expire_without_confirmation(clock):
    table, scheduler = make(clock, "a", lag_s=1.0)
    scheduler.try_acquire("n").release(ok=True)
    clock.advance(table.learned_max_age_s - 0.1)
    table.usable(clock())
    assert table.get("a").loaded("n")
    clock.advance(0.2)
    table.usable(clock())
    assert not table.get("a").loaded("n")


def test_a_view_change_shows_in_the_snapshot(clock):
    table, _ = make(clock, "a", "b")
    table.apply(info("a", models=["m1", "m2"], version=5), clock())
    table.apply(info("b", ready=False), clock())
    snap = {r["name"]: r for r in table.snapshot()}
    assert snap["a"]["models"] == ["m1", "m2"] and snap["a"]["version"] == 5 and snap["a"]["ready"]
    assert not snap["b"]["ready"]
    assert [r.name for r in table.usable(clock())] == ["a"]


def test_a_full_listing_drops_replicas_that_are_gone(clock):
    table, _ = make(clock, "a", "b")
    table.apply(ReplicasListed((info("b"), info("c"))), clock())
    assert sorted(r.name for r in table.replicas()) == ["b", "c"]
    table.apply(ReplicaGone("b"), clock())
    table.apply(ReplicaGone("nope"), clock())
    assert [r.name for r in table.usable(clock())] == ["c"]


# -- failures --------------------------------------------------------------------------------


def test_a_failed_replica_is_out_until_seen_alive_after_the_failure(clock):
    table, scheduler = make(clock, "a", "b")
    table.apply(ConnectionFailed(table.get("a")), clock())
    assert [r.name for r in table.usable(clock())] == ["b"]
    assert not table.snapshot()[0]["ready"]
    # A poll that began before the failure proves nothing.
    table.apply(info("a"), clock() - 0.05)
    assert [r.name for r in table.usable(clock())] == ["b"]
    clock.advance(0.01)
    table.apply(info("a"), clock())
    assert sorted(r.name for r in table.usable(clock())) == ["a", "b"]


def test_the_quarantine_runs_out(clock):
    table, _ = make(clock, "a", "b")
    table.apply(ConnectionFailed(table.get("a")), clock())
    clock.advance(table.quarantine_s - 0.1)
    assert [r.name for r in table.usable(clock())] == ["b"]
    clock.advance(0.2)
    assert sorted(r.name for r in table.usable(clock())) == ["a", "b"]


def test_with_no_ready_replica_a_request_waits_instead_of_failing(clock):
    table, scheduler = make(clock)
    assert scheduler.try_acquire("m") is None
    table.apply(info("a", ready=False), clock())
    assert scheduler.try_acquire("m") is None


def test_per_replica_max_ongoing_requests(clock):
    table, scheduler = make(clock, "a", "b", max_ongoing=2)
    leases = [scheduler.try_acquire("") for _ in range(4)]
    assert all(lease is not None for lease in leases)
    assert sorted(r.inflight for r in table.replicas()) == [2, 2]
    assert scheduler.try_acquire("") is None
    assert scheduler.try_acquire("m") is None
    leases[0].release(ok=True)
    assert scheduler.try_acquire("").replica is leases[0].replica


def test_excluded_replicas_are_skipped(clock):
    table, scheduler = make(clock, "a", "b")
    table.apply(info("a", models=["m"]), clock())
    lease = scheduler.try_acquire("m", exclude={"a"})
    assert lease.replica.name == "b"
    assert scheduler.try_acquire("m", exclude={"a", "b"}) is None


# -- waiting (real event loop; bounded) ------------------------------------------------------


async def test_a_request_held_while_no_replica_is_ready_goes_to_the_first_that_becomes_ready():
    loop = asyncio.get_running_loop()
    table, scheduler = make(loop.time, queue_timeout_s=10.0)
    waiter = asyncio.create_task(scheduler.acquire("m"))
    await asyncio.sleep(5.0)
    assert not waiter.done() and scheduler.queued == 1
    table.apply(info("a"), loop.time())
    lease = await asyncio.wait_for(waiter, 1)
    assert lease.replica.name == "a" and loop.time() == pytest.approx(5.0, abs=0.01)


async def test_a_request_held_past_the_bound_with_no_ready_replica_gets_503_not_ready():
    loop = asyncio.get_running_loop()
    table, scheduler = make(loop.time, queue_timeout_s=10.0)
    table.apply(info("a", ready=False), loop.time())
    with pytest.raises(NotReady) as raised:
        await scheduler.acquire("m")
    assert loop.time() == pytest.approx(10.0, abs=0.01)
    assert raised.value.status == 503 and raised.value.retry_after == 1.0
    assert "became ready within 10 s" in raised.value.message
    assert scheduler.queued == 0



async def test_a_request_waits_for_a_slot_and_gets_it_when_one_frees():
    table, scheduler = make(lambda: asyncio.get_running_loop().time(), "a", max_ongoing=1)
    held = await scheduler.acquire("m")
    waiter = asyncio.create_task(scheduler.acquire("m"))
    await asyncio.sleep(0.05)
    assert not waiter.done() and scheduler.queued == 1
    held.release(ok=True)
    lease = await asyncio.wait_for(waiter, 5)
    assert lease.replica.name == "a" and lease.kind is Kind.HIT
    assert scheduler.queued == 0


async def test_requests_are_refused_with_503_past_the_queue_bound():
    table, scheduler = make(lambda: asyncio.get_running_loop().time(), "a", max_ongoing=1,
                            queue_timeout_s=0.2, max_queued=1)
    await scheduler.acquire("m")
    waiter = asyncio.create_task(scheduler.acquire("m"))
    await asyncio.sleep(0.01)
    with pytest.raises(Overloaded):  # the queue is full: at once
        await scheduler.acquire("m")
    with pytest.raises(Overloaded) as raised:  # waited past the bound
        await asyncio.wait_for(waiter, 5)
    assert raised.value.status == 503 and raised.value.retry_after
    assert scheduler.queued == 0


async def test_a_waiting_request_spreads_after_the_matching_timeout():
    loop_clock = lambda: asyncio.get_running_loop().time()  # noqa: E731
    scheduler = Scheduler(Params(max_ongoing=1, matching_timeout_s=0.1, hot_spread=False),
                          clock=loop_clock, rng=random.Random(0))
    table = scheduler.table
    table.apply(info("a", models=["m"]), 0.0)
    table.apply(info("b"), 0.0)
    holder = await scheduler.acquire("m")  # M's only holder is now full
    started = loop_clock()
    lease = await asyncio.wait_for(scheduler.acquire("m"), 5)
    assert loop_clock() - started >= 0.1
    assert lease.replica is not holder.replica
    assert lease.kind is Kind.FALLBACK


async def test_requests_waiting_for_a_load_leave_the_slots_to_loaded_models():
    loop_clock = lambda: asyncio.get_running_loop().time()  # noqa: E731
    scheduler = Scheduler(Params(max_ongoing=2, matching_timeout_s=0.1), clock=loop_clock, queue_timeout_s=0.3)
    table = scheduler.table
    table.apply(info("a", models=["x"]), 0.0)
    hung = [await scheduler.acquire("m") for _ in range(2)]  # M's load hangs on "a"
    assert table.get("a").inflight == 0 and table.get("a").waiting("m") == 2
    served = [await asyncio.wait_for(scheduler.acquire("x"), 1) for _ in range(2)]
    assert all(lease.kind is Kind.HIT for lease in served)
    with pytest.raises(Overloaded):  # M's own queue is full: only M's requests wait, and give up
        await scheduler.acquire("m")
    for lease in hung + served:
        lease.release(ok=False)
    assert table.get("a").inflight == 0 and table.get("a").pending == {}


async def test_a_long_line_for_a_stuck_model_does_not_keep_a_freed_slot_from_other_models():
    table, scheduler = make(lambda: asyncio.get_running_loop().time(), "a", max_ongoing=1)
    table.apply(info("a", models=["x"]), asyncio.get_running_loop().time())
    hung = await scheduler.acquire("m")  # M's load hangs on "a"; its queue (1) is full
    held = await scheduler.acquire("x")  # the only slot
    stuck = [asyncio.create_task(scheduler.acquire("m")) for _ in range(50)]
    await asyncio.sleep(0)
    behind = asyncio.create_task(scheduler.acquire("x"))
    await asyncio.sleep(0)
    assert scheduler.queued == 51
    held.release(ok=True)
    lease = await asyncio.wait_for(behind, 0.5)  # at once, not at its matching timeout
    assert lease.kind is Kind.HIT
    for task in stuck:
        task.cancel()
    await asyncio.gather(*stuck, return_exceptions=True)
    hung.release(ok=False)
    lease.release(ok=True)


async def test_a_freed_slot_goes_to_the_oldest_waiter_without_waking_the_whole_line():
    table, scheduler = make(lambda: asyncio.get_running_loop().time(), "a", max_ongoing=1)
    calls = 0
    choose = scheduler._choose

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return choose(*args, **kwargs)

    scheduler._choose = counting
    held = await scheduler.acquire("")
    order: list[int] = []

    async def waiter(i):
        lease = await scheduler.acquire("")
        order.append(i)
        await asyncio.sleep(0)
        lease.release(ok=True)

    tasks = []
    for i in range(200):
        tasks.append(asyncio.create_task(waiter(i)))
        await asyncio.sleep(0)  # each one queues in turn
    assert scheduler.queued == 200
    calls = 0
    held.release(ok=True)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == list(range(200))  # first come, first served
    assert calls <= 3 * 200  # a few policy runs per freed slot, not one per waiter (200 x 200)


async def test_a_waiter_cancelled_after_being_handed_a_slot_passes_it_on():
    table, scheduler = make(lambda: asyncio.get_running_loop().time(), "a", max_ongoing=1)
    held = await scheduler.acquire("")
    first = asyncio.create_task(scheduler.acquire(""))
    await asyncio.sleep(0)
    second = asyncio.create_task(scheduler.acquire(""))
    third = asyncio.create_task(scheduler.acquire(""))
    await asyncio.sleep(0.01)
    held.release(ok=True)  # hands the slot to the first
    first.cancel()  # whose client hung up before it ran: the slot goes on to the second
    await asyncio.sleep(0)
    second.cancel()  # and the same again
    lease = await asyncio.wait_for(third, 5)
    assert lease.replica.name == "a"
    assert scheduler.queued == 0


# -- each event's effect on the table, and what it tells the scheduler -------------------------


def noted_table(**kwargs) -> tuple[RoutingTable, list[Change]]:
    """A table whose notifier writes down what it is told."""
    changes: list[Change] = []
    return RoutingTable(notify=changes.append, **kwargs), changes


def test_a_replica_seen_with_its_document_is_taken_in_whole_and_a_repeat_is_no_news():
    table, changes = noted_table()
    table.apply(info("a", models=["m"], loading=["n"], capacity=3, version=4), 1.0)
    replica = table.get("a")
    assert (replica.url, replica.ready, replica.capacity, replica.version) == ("http://a", True, 3, 4)
    assert replica.models == {"m"} and replica.reported_loading == {"n"} and replica.observed_at == 1.0
    assert replica.document == LoadedModels(4, 3, ("m",), ("n",))
    assert changes == [Change.CHANGED]
    table.apply(info("a", models=["m"], loading=["n"], capacity=3, version=4), 2.0)
    assert changes == [Change.CHANGED]  # nothing a waiter could use


def test_a_replica_seen_with_only_its_summary_keeps_its_document_and_becomes_stale():
    table, changes = noted_table()
    table.apply(info("a", models=["m"], capacity=3, version=4), 1.0)
    table.apply(ReplicaSeen("a", "http://a", True, Held(LoadedSummary(version=6, capacity=5))), 2.0)
    replica = table.get("a")
    assert replica.models == {"m"} and replica.version == 4  # what it knows, until the fetch
    assert replica.capacity == 5 and replica.latest_version == 6 and replica.stale
    assert [r.name for r in table.stale_replicas()] == ["a"]
    assert changes == [Change.CHANGED]


def test_a_fetched_document_keeps_the_replicas_address_and_readiness():
    table, changes = noted_table()
    table.apply(DocumentFetched("nobody", LoadedModels(version=1)), 1.0)  # gone meanwhile: ignored
    assert len(table) == 0
    table.apply(ReplicaSeen("a", "http://a", False, Held(LoadedSummary(version=2))), 1.0)
    table.apply(DocumentFetched("a", LoadedModels(version=2, capacity=2, models=("m",))), 2.0)
    replica = table.get("a")
    assert not replica.ready and replica.url == "http://a"
    assert replica.models == {"m"} and not replica.stale


def test_a_summary_header_is_parsed_once_per_distinct_text_and_a_malformed_one_is_ignored():
    table, _ = noted_table()
    table.apply(info("a", version=2), 1.0)
    replica = table.get("a")
    header = LoadedSummary(version=3).to_json()
    table.apply(SummaryHeard(replica, header), 2.0)
    assert (replica.heard_header, replica.heard_version, replica.latest_version) == (header, 3, 3)
    table.apply(SummaryHeard(replica, "{not json"), 3.0)
    assert (replica.heard_header, replica.latest_version) == (header, 3)  # unchanged
    table.apply(SummaryHeard(replica, LoadedSummary(version=1).to_json()), 4.0)
    assert replica.latest_version == 3  # announced versions never go back


def test_a_request_for_a_loaded_model_takes_a_slot_and_frees_it():
    table, changes = noted_table()
    table.apply(info("a", models=["m"]), 1.0)
    replica = table.get("a")
    started = RequestStarted.to(replica, "m")
    assert not started.for_load
    table.apply(started, 1.0)
    assert replica.in_slots == 1 and replica.inflight == 1 and replica.pending == {}
    table.apply(RequestFinished(started, ok=True), 2.0)
    assert replica.in_slots == 0 and replica.learned == {"m": 2.0}
    assert changes == [Change.CHANGED, Change.FREED]


def test_a_request_for_a_model_not_loaded_waits_for_its_load_and_a_failed_load_is_news():
    table, changes = noted_table()
    table.apply(info("a"), 1.0)
    replica = table.get("a")
    first, second = RequestStarted.to(replica, "m"), RequestStarted.to(replica, "m")
    assert first.for_load and second.for_load
    table.apply(first, 1.0)
    table.apply(second, 1.0)
    assert replica.pending == {"m": 2} and replica.in_slots == 0 and replica.is_loading("m")
    table.apply(RequestFinished(first, ok=False), 2.0)
    assert replica.pending == {"m": 1} and changes[-1] is Change.FREED
    table.apply(RequestFinished(second, ok=False), 2.0)
    assert replica.pending == {} and not replica.holds("m")
    assert changes[-1] is Change.CHANGED  # the load failed: its waiters may go elsewhere


def test_the_table_writes_then_tells_so_a_waiter_told_of_a_failed_load_no_longer_sees_its_replica_hold_it():
    seen: list[tuple[Change, list[str]]] = []
    table = RoutingTable(notify=lambda change: seen.append((change, [r.name for r in table.holders("m")])))
    table.apply(info("a"), 1.0)
    started = RequestStarted.to(table.get("a"), "m")
    table.apply(started, 1.0)
    assert [r.name for r in table.holders("m")] == ["a"]  # loading there
    table.apply(RequestFinished(started, ok=False), 2.0)
    assert seen[-1] == (Change.CHANGED, [])  # the index was updated before anyone was told


def test_the_table_writes_then_tells_so_a_waiter_told_of_a_success_sees_the_model_held():
    seen: list[tuple[Change, list[str]]] = []
    table = RoutingTable(notify=lambda change: seen.append((change, [r.name for r in table.holders("m")])))
    table.apply(info("a", models=["m"]), 1.0)
    table.apply(ReplicaSeen("a", "http://a", True, Held.of(LoadedModels(2, 2, ()))), 1.5)  # evicted meanwhile
    started = RequestStarted(table.get("a"), "m", for_load=False)  # sent while it was still loaded
    table.apply(started, 1.5)
    table.apply(RequestFinished(started, ok=True), 2.0)
    assert seen[-1] == (Change.FREED, ["a"])  # learned from the answer, and indexed before the news


def test_a_request_naming_no_model_takes_a_slot():
    table, _ = noted_table()
    table.apply(info("a"), 1.0)
    assert not RequestStarted.to(table.get("a"), "").for_load


def test_an_answer_and_a_connection_failure_are_noted_on_the_record_without_news():
    table, changes = noted_table(quarantine_s=5.0)
    table.apply(info("a"), 1.0)
    replica = table.get("a")
    table.apply(Answered(replica), 2.0)
    assert replica.answered_at == 2.0 and table.answered_since("a", 2.0)
    table.apply(ConnectionFailed(replica), 3.0)
    table.apply(ConnectionFailed(replica), 4.0)  # the first failure starts the quarantine
    assert replica.down_at == 3.0 and table.usable(4.0) == []
    assert table.quarantine_ends(4.0) == 8.0
    assert table.usable(8.0) == [replica] and table.quarantine_ends(8.0) == float("inf")
    assert changes == [Change.CHANGED]  # the end of a quarantine is read, never notified


def test_gone_and_listed_replicas_are_news():
    table, changes = noted_table()
    table.apply(ReplicasListed((info("a"), info("b"))), 1.0)
    assert sorted(r.name for r in table.replicas()) == ["a", "b"]
    assert changes == [Change.CHANGED]  # once, with the whole listing in
    changes.clear()
    table.apply(ReplicaGone("a"), 2.0)
    table.apply(ReplicaGone("a"), 2.0)  # already gone: no news
    assert changes == [Change.CHANGED] and [r.name for r in table.replicas()] == ["b"]


def test_anything_else_is_refused():
    table, _ = noted_table()
    with pytest.raises(TypeError):
        table.apply("ready", 1.0)  # type: ignore[arg-type]


async def test_a_request_waiting_for_a_quarantined_replica_gets_it_when_the_quarantine_runs_out():
    loop = asyncio.get_running_loop()
    table, scheduler = make(loop.time, "a", queue_timeout_s=10.0)
    table.apply(ConnectionFailed(table.get("a")), loop.time())
    lease = await asyncio.wait_for(scheduler.acquire("m"), 5)  # nothing but the clock tells it
    assert lease.replica.name == "a" and loop.time() == pytest.approx(table.quarantine_s, abs=0.01)


def test_a_model_this_router_unloaded_is_dropped_at_once_and_wakes_waiters():
    changes: list = []
    table = RoutingTable(notify=changes.append)
    table.apply(ReplicaSeen("r0", "http://r0", True, Held.of(LoadedModels(version=3, capacity=2, models=("m1", "m2")))), 0.0)
    (replica,) = table.replicas()
    changes.clear()
    table.apply(Unloaded(replica, "m1"), 1.0)
    assert replica.holds("m2") and not replica.holds("m1") and not replica.loaded("m1")
    assert changes == [Change.CHANGED]
