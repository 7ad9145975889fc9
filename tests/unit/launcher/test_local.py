"""Local mode's supervisor: the restart backoff (pure, no processes)."""

from __future__ import annotations

from modelplex_launcher.local import HEALTHY_RUN_S, RESTART_BACKOFF_MAX_S, restart_delay


def crash_loop(runs: list[float]) -> list[float]:
    """The delays a child gets when it exits after running each of ``runs`` seconds in turn."""
    restarts, delays = 0, []
    for ran_s in runs:
        delay, restarts = restart_delay(restarts, ran_s)
        delays.append(delay)
    return delays


def test_a_crash_loop_backs_off_up_to_the_cap():
    assert crash_loop([0.5] * 8) == [1, 2, 4, 8, 16, RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_MAX_S]


def test_the_backoff_starts_over_after_a_healthy_run():
    # The case: a replica that ran healthy for 20 s between kills got 1, 2, 4 s.
    assert crash_loop([20.0, 20.0, 20.0]) == [1, 1, 1]
    assert crash_loop([0.5, 0.5, 0.5, HEALTHY_RUN_S, 0.5]) == [1, 2, 4, 1, 2]


def test_a_run_just_short_of_healthy_still_counts_as_a_crash():
    assert crash_loop([0.5, HEALTHY_RUN_S - 0.01]) == [1, 2]
