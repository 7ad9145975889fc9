"""A replica killed, frozen or stopped under load: the router keeps every unary request answered."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest

from support.chaos import load, ready_replicas, replica_pids, wait_for_replicas
from support.stacks import manifest, start_local, write_documents

MODELS = [f"m{i}" for i in range(4)]
REQUEST_TIMEOUT_S = 6.0  # generous: two shared cores make a healthy answer slow at times
FREEZE_S = 12.0
CLIENTS = 8
BODY = {"work": 0.3}  # each request computes for about 0.3 s: some are always in flight


@pytest.fixture(scope="module")
def stack(module_processes):
    path = write_documents(module_processes.folder / "faults.yaml", [manifest(
        "faults", "handlers:Models", replicas=2, maxOngoingRequests=8, gracefulShutdownTimeoutSeconds=10,
        multiplexing={"maxModelsPerReplica": 4, "prewarm": MODELS},
        router={"requestTimeoutSeconds": REQUEST_TIMEOUT_S})])
    return start_local(module_processes, path, 1)


async def _victim(session, stack) -> tuple[int, int]:
    await wait_for_replicas(session, stack.url("faults"), 2)
    return sorted(replica_pids(stack).items())[0]


async def _restarted(session, stack, port: int, old_pid: int, since: float) -> float:
    """Seconds from ``since`` until the replica on ``port`` runs again (a new process) and the
    router counts both replicas ready."""
    deadline = time.monotonic() + 90
    while replica_pids(stack).get(port) in (None, old_pid):
        assert time.monotonic() < deadline, "the supervisor did not restart the replica"
        await asyncio.sleep(0.1)
    await wait_for_replicas(session, stack.url("faults"), 2)
    return time.monotonic() - since


@pytest.mark.parametrize(("sig", "seconds", "after", "fault"), [
    (signal.SIGKILL, 10, 3, "kill -9 of a replica (2 replicas, 8 clients, 10 s)"),
    (signal.SIGTERM, 8, 2, "SIGTERM of a replica (2 replicas, 8 clients, 8 s)"),
], ids=["kill-9", "sigterm"])
async def test_a_replica_killed_or_stopped_under_load_loses_no_unary_request(stack, chaos_report, sig, seconds,
                                                                              after, fault):
    url = stack.url("faults")
    async with aiohttp.ClientSession() as session:
        port, pid = await _victim(session, stack)
        running = asyncio.create_task(load(session, url + "/", MODELS, clients=CLIENTS, seconds=seconds, body=BODY))
        await asyncio.sleep(after)
        os.kill(pid, sig)
        signalled = time.monotonic()
        tally = await running
        recovery = await _restarted(session, stack, port, pid, signalled)
    chaos_report(tally.line(fault, recovery))
    assert not tally.lost, tally.lost[:3]
    assert tally.by_status() == {"200": tally.sent}
    assert tally.sent > 50


async def test_a_frozen_replica_answers_504_within_the_timeout_and_leaves_rotation(stack, chaos_report):
    url = stack.url("faults")
    async with aiohttp.ClientSession() as session:
        port, pid = await _victim(session, stack)
        running = asyncio.create_task(load(session, url + "/", MODELS, clients=CLIENTS, seconds=FREEZE_S + 4,
                                           body=BODY))
        await asyncio.sleep(2)
        os.kill(pid, signal.SIGSTOP)
        try:
            frozen = time.monotonic()
            # Out of rotation: the router stops counting it (polls, or the timeout's quarantine).
            while await ready_replicas(session, url) > 1:
                assert time.monotonic() - frozen < 30, "the frozen replica stayed in rotation"
                await asyncio.sleep(0.1)
            left_rotation = time.monotonic() - frozen
            await asyncio.sleep(max(0.0, FREEZE_S - left_rotation))
        finally:
            os.kill(pid, signal.SIGCONT)
        thawed = time.monotonic()
        tally = await running
        await wait_for_replicas(session, url, 2)
        recovery = time.monotonic() - thawed
    timeouts = [o for o in tally.outcomes if o.status == 504]
    chaos_report(tally.line(f"SIGSTOP of a replica for {FREEZE_S:g} s (requestTimeoutSeconds {REQUEST_TIMEOUT_S:g})",
                            recovery,
                            out_of_rotation=f"{left_rotation:.1f}s", slowest=f"{tally.max_seconds():.1f}s"))
    assert not tally.lost, tally.lost[:3]
    assert tally.statuses() <= {200, 504}, tally.by_status()
    # The requests that were on it when it froze got a 504 naming it and their model, in time.
    assert timeouts, "no request was caught on the frozen replica"
    for outcome in timeouts:
        message = json.loads(outcome.body)["error"]["message"]
        assert "faults-0" in message or "faults-1" in message, message
        assert "for model 'm" in message and "requestTimeoutSeconds" in message, message
    assert tally.max_seconds() <= REQUEST_TIMEOUT_S + 2 + 2, tally.max_seconds()  # + 2 s: a busy machine
    assert len(timeouts) <= 2 * CLIENTS
    assert sum(o.status == 200 for o in tally.outcomes if o.started > frozen + left_rotation + 1) > 10
