"""What the proxy tells the scheduler's table about a replica (pure: a routing table and a fake
clock, no sockets)."""

from __future__ import annotations

import asyncio
import random

from modelplex.wire.loaded import LoadedModels, LoadedSummary
from modelplex_router.events import Answered, ConnectionFailed, ReplicaSeen, SummaryHeard
from modelplex_router.policy import Params
from modelplex_router.record import Held
from modelplex_router.scheduler import Scheduler


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def seen(name: str, version: int = 1) -> ReplicaSeen:
    return ReplicaSeen(name, f"http://{name}", True, Held.of(LoadedModels(version=version, capacity=4)))


def scheduler_of(clock: FakeClock, *names: str, version: int = 1) -> Scheduler:
    scheduler = Scheduler(Params(max_ongoing=4, matching_timeout_s=1.0), quarantine_s=30.0, clock=clock,
                          rng=random.Random(0), deployment="d")
    for name in names:
        scheduler.table.apply(seen(name, version), clock())
    return scheduler


def routed(scheduler: Scheduler, requests: int = 8) -> set[str]:
    """The replicas ``requests`` requests, one after another, go to."""
    names = set()
    for _ in range(requests):
        lease = scheduler.try_acquire("")
        names.add(lease.replica.name)
        lease.release(ok=True)
    return names


def test_a_replica_that_failed_gets_no_request_until_seen_alive_again():
    clock = FakeClock()
    scheduler = scheduler_of(clock, "a", "b")
    scheduler.table.apply(ConnectionFailed(scheduler.table.get("a")), clock())
    assert routed(scheduler) == {"b"}
    clock.now += 1
    scheduler.table.apply(seen("a"), clock())  # a poll finds it ready
    assert routed(scheduler) == {"a", "b"}


def test_a_replica_that_answered_counts_as_alive_from_that_time():
    clock = FakeClock()
    scheduler = scheduler_of(clock, "a")
    assert not scheduler.table.answered_since("a", clock())
    clock.now += 5
    scheduler.table.apply(Answered(scheduler.table.get("a")), clock())
    assert scheduler.table.answered_since("a", 104.0) and not scheduler.table.answered_since("a", 106.0)


async def test_a_newer_version_heard_in_an_answer_makes_the_replicas_document_stale():
    clock = FakeClock()
    table = scheduler_of(clock, "a", "b", version=3).table
    a = table.get("a")
    table.apply(SummaryHeard(a, LoadedSummary(version=3).to_json()), clock())  # what it had: nothing to fetch
    assert table.stale_replicas() == []
    waiting = asyncio.create_task(table.wait_stale())
    await asyncio.sleep(0)
    assert not waiting.done()
    table.apply(SummaryHeard(a, LoadedSummary(version=4).to_json()), clock())
    assert [r.name for r in table.stale_replicas()] == ["a"]
    await asyncio.wait_for(waiting, 5)  # the fetcher wakes
