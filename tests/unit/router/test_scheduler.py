"""What the proxy tells the scheduler about a replica, and the bound on refusals it asks of it
(pure: a routing table and a fake clock, no sockets)."""

from __future__ import annotations

import random

from modelplex_router.policy import Params
from modelplex_router.scheduler import Scheduler
from modelplex_router.table import ReplicaInfo, RoutingTable


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def scheduler_of(clock: FakeClock, *names: str, version: int = 1) -> Scheduler:
    table = RoutingTable(quarantine_s=30.0)
    for name in names:
        table.apply(ReplicaInfo(name, f"http://{name}", True, (), 4, version, ()), clock())
    return Scheduler(table, Params(max_ongoing=4, matching_timeout_s=1.0), clock=clock, rng=random.Random(0),
                     deployment="d")


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
    scheduler.failed(scheduler.table.get("a"))
    assert routed(scheduler) == {"b"}
    clock.now += 1
    scheduler.table.apply(ReplicaInfo("a", "http://a", True, (), 4, 1, ()), clock())  # a poll finds it ready
    assert routed(scheduler) == {"a", "b"}


def test_a_replica_that_answered_counts_as_alive_from_that_time():
    clock = FakeClock()
    scheduler = scheduler_of(clock, "a")
    assert not scheduler.table.answered_since("a", clock())
    clock.now += 5
    scheduler.answered(scheduler.table.get("a"))
    assert scheduler.table.answered_since("a", 104.0) and not scheduler.table.answered_since("a", 106.0)


def test_a_newer_version_heard_in_an_answer_makes_the_replicas_document_stale():
    clock = FakeClock()
    scheduler = scheduler_of(clock, "a", "b", version=3)
    fetches = []
    scheduler.table.stale_listener = lambda: fetches.append(True)
    scheduler.heard_version(scheduler.table.get("a"), 3)  # what it had: nothing to fetch
    assert scheduler.table.stale_replicas() == [] and fetches == []
    scheduler.heard_version(scheduler.table.get("a"), 4)
    assert [r.name for r in scheduler.table.stale_replicas()] == ["a"] and fetches == [True]
