"""The loaded-models reporter coalesces bursts and always ends on the latest state.

The patch function here records documents; the real Kubernetes patch is exercised end to
end in the operator tests.
"""

import asyncio
import json
import threading

import pytest

from modelplex.processes import wait_for_async
from modelplex.wire.loaded import LoadedSummary
from modelplex.wire.names import ANNOTATION_LOADED_MODELS
from modelplex_replica.reporter import AnnotationReporter


class State:
    def __init__(self):
        self.version = 0

    def summary(self):
        return LoadedSummary(version=self.version, models=1, capacity=3)


async def test_a_burst_of_changes_is_coalesced_and_the_last_state_wins():
    state, patches = State(), []
    in_flight = threading.Event()
    release = threading.Event()

    def patch(body):
        patches.append(json.loads(body["metadata"]["annotations"][ANNOTATION_LOADED_MODELS]))
        in_flight.set()
        release.wait(10)  # the API server is slow: changes pile up meanwhile

    reporter = AnnotationReporter(state.summary, patch)
    await reporter.start()
    await asyncio.to_thread(in_flight.wait, 10)
    for _ in range(20):
        state.version += 1
        reporter.changed()
    release.set()
    await wait_for_async(lambda: reporter.published_version == 20, 5, 0.01, "version 20 published")
    await reporter.stop()
    assert patches[0]["version"] == 0
    assert patches[-1] == {"version": 20, "models": 1, "loading": 0, "capacity": 3, "bytes": 0, "capacityBytes": 0}
    assert len(patches) <= 3  # the initial state, then at most one or two for the burst


async def test_a_failed_patch_is_retried_until_it_lands():
    state, attempts = State(), []

    def flaky_patch(body):
        attempts.append(body)
        if len(attempts) < 3:
            raise ConnectionError("apiserver restarting")

    reporter = AnnotationReporter(state.summary, flaky_patch)
    await reporter.start()
    await wait_for_async(lambda: reporter.published_version == 0, 5, 0.01, "version 0 published")
    await reporter.stop()
    assert len(attempts) == 3


@pytest.mark.looptime
async def test_patches_are_at_most_one_a_second_and_end_on_the_latest_state():
    state, times = State(), []
    loop = asyncio.get_running_loop()

    def patch(body):
        times.append((loop.time(), json.loads(body["metadata"]["annotations"][ANNOTATION_LOADED_MODELS])["version"]))

    reporter = AnnotationReporter(state.summary, patch, clock=loop.time)
    await reporter.start()
    for _ in range(200):  # 200 changes over 10 s (a stream of failed loads)
        state.version += 1
        reporter.changed()
        await asyncio.sleep(0.05)
    await asyncio.sleep(2)
    await reporter.stop()
    assert times[-1][1] == 200
    gaps = [later - earlier for (earlier, _), (later, _) in zip(times, times[1:])]
    assert all(gap >= 1.0 - 1e-6 for gap in gaps), gaps
    assert len(times) <= 12 and reporter.patches == len(times)


@pytest.mark.looptime
async def test_a_state_already_published_is_not_patched_again():
    state, patches = State(), []
    reporter = AnnotationReporter(state.summary, patches.append)
    await reporter.start()
    for _ in range(5):
        reporter.changed()  # nothing changed in the summary
        await asyncio.sleep(2)
    await reporter.stop()
    assert len(patches) == 1


@pytest.mark.looptime
async def test_under_zipf_churn_each_replica_patches_at_most_once_per_interval_and_ends_on_its_latest_state():
    # 50 replicas, each loading and evicting on its own Zipf-driven schedule for 20 virtual seconds:
    # the API server sees at most one write per replica per interval, so the fleet's write rate is
    # bounded by replicas / MIN_PATCH_INTERVAL_S whatever the churn, and every replica's last
    # state is published.
    import random

    from modelplex_replica.reporter import MIN_PATCH_INTERVAL_S

    loop = asyncio.get_running_loop()
    rng = random.Random(5)
    replicas, seconds = 50, 20.0
    states = [State() for _ in range(replicas)]
    writes: list[list[float]] = [[] for _ in range(replicas)]
    reporters = []
    for i in range(replicas):
        def patch(body, i=i):
            writes[i].append(loop.time())
        reporters.append(AnnotationReporter(states[i].summary, patch, clock=loop.time))
    for reporter in reporters:
        await reporter.start()
    # A Zipf(1.1) trace over 500 models on 50 replicas of capacity 4: a request for a model the
    # chosen replica does not hold is a load (and, when full, an eviction): a change to publish.
    weights = [1 / (k + 1) ** 1.1 for k in range(500)]
    held = [set() for _ in range(replicas)]
    changes = 0
    end = loop.time() + seconds
    while loop.time() < end:
        model = rng.choices(range(500), weights)[0]
        i = rng.randrange(replicas)
        if model not in held[i]:
            if len(held[i]) >= 4:
                held[i].pop()
            held[i].add(model)
            states[i].version += 1
            reporters[i].changed()
            changes += 1
        await asyncio.sleep(0.004)  # 250 requests a second
    await asyncio.sleep(MIN_PATCH_INTERVAL_S * 2)
    for reporter in reporters:
        await reporter.stop()
    assert changes > 3 * replicas * seconds  # the churn is well above the bound
    # Over the trace and the 2 s after it, at most one patch per interval per replica (plus the
    # first, which publishes at once). Counted, not timed: the patch runs in a worker thread,
    # whose reading of the virtual clock can lag the reporter's.
    bound = int((seconds + 2 * MIN_PATCH_INTERVAL_S) / MIN_PATCH_INTERVAL_S) + 1
    for i, reporter in enumerate(reporters):
        assert 1 <= len(writes[i]) <= bound, (i, len(writes[i]))
        assert reporter.published_version == states[i].version
    assert sum(len(w) for w in writes) <= replicas * bound < changes
