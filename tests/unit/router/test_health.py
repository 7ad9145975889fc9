"""A polled replica leaves rotation on evidence, not on one slow poll."""

from __future__ import annotations

from modelplex_router.discovery.health import Poll, PollHealth


def test_a_replica_stays_in_rotation_through_fewer_failed_polls_than_the_threshold():
    health = PollHealth(failure_threshold=3)
    assert health.observe(Poll.READY)
    assert health.observe(Poll.FAILED)
    assert health.observe(Poll.FAILED)
    assert not health.observe(Poll.FAILED)


def test_one_good_poll_resets_the_count_and_brings_it_back():
    health = PollHealth(failure_threshold=2)
    health.observe(Poll.READY)
    health.observe(Poll.FAILED)
    assert health.observe(Poll.READY) and health.failures == 0
    health.observe(Poll.FAILED)
    assert not health.observe(Poll.FAILED)
    assert health.observe(Poll.READY)


def test_refused_connections_and_its_own_not_ready_take_it_out_at_once():
    for poll in (Poll.REFUSED, Poll.NOT_READY):
        health = PollHealth(failure_threshold=5)
        health.observe(Poll.READY)
        assert not health.observe(poll), poll


def test_answered_traffic_counts_as_alive_while_its_polls_time_out():
    health = PollHealth(failure_threshold=2)
    health.observe(Poll.READY)
    for _ in range(10):
        assert health.observe(Poll.FAILED, answered_traffic=True)
    assert health.failures == 0
    health.observe(Poll.FAILED)
    assert not health.observe(Poll.FAILED)


def test_traffic_does_not_bring_back_a_replica_that_is_out():
    health = PollHealth(failure_threshold=1)
    health.observe(Poll.READY)
    assert not health.observe(Poll.FAILED)
    assert not health.observe(Poll.FAILED, answered_traffic=True)
