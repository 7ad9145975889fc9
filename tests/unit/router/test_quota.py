"""Cold loads per client: token buckets on a fake clock."""

from __future__ import annotations

import pytest

from modelplex_router.quota import LoadQuotas


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_client_gets_its_burst_then_waits_for_the_refill():
    clock = FakeClock()
    quotas = LoadQuotas(loads_per_minute=6, burst=3, clock=clock)
    assert [quotas.take("alice") for _ in range(3)] == [None, None, None]
    assert quotas.take("alice") == pytest.approx(10.0)  # 6 a minute: one every 10 s
    clock.now += 4
    assert quotas.take("alice") == pytest.approx(6.0)
    clock.now += 6
    assert quotas.take("alice") is None
    assert quotas.take("alice") == pytest.approx(10.0)


def test_clients_have_buckets_of_their_own():
    quotas = LoadQuotas(loads_per_minute=1, burst=1, clock=FakeClock())
    assert quotas.take("alice") is None
    assert quotas.take("alice") is not None
    assert quotas.take("bob") is None


def test_the_bucket_never_fills_past_the_burst():
    clock = FakeClock()
    quotas = LoadQuotas(loads_per_minute=60, burst=2, clock=clock)
    quotas.take("alice")
    clock.now += 3600  # an hour idle
    assert [quotas.take("alice") is None for _ in range(3)] == [True, True, False]


def test_only_the_most_recent_clients_are_kept():
    clock = FakeClock()
    quotas = LoadQuotas(loads_per_minute=1, burst=1, clock=clock, max_clients=2)
    for client in ("a", "b", "c"):
        assert quotas.take(client) is None
    assert len(quotas) == 2
    assert quotas.take("c") is not None  # kept: still spent
    assert quotas.take("a") is None  # dropped: starts again with a full bucket
