"""SIGTERM of ``modelplex local`` under load: every request it accepted is answered in full
(streams included) within gracefulShutdownTimeoutSeconds, then everything exits. The requests
outlast the fixed drains local mode had before (a router gave 5 s, the supervisor 10 s)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp

from support.chaos import Outcome, Tally, request
from support.servers import wait_until
from support.stacks import manifest, start_local, write_documents

GRACE_S = 15
CHUNKS = 30


async def stream(session: aiohttp.ClientSession, url: str) -> Outcome:
    started = time.monotonic()
    try:
        async with session.post(url, json={"chunks": CHUNKS, "every": 0.25},
                                timeout=aiohttp.ClientTimeout(total=60)) as response:
            body = await response.read()
            return Outcome(started, time.monotonic() - started, response.status, body)
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        return Outcome(started, time.monotonic() - started, None, error=repr(error))


async def all_in_flight(session: aiohttp.ClientSession, stack, expected: dict[str, int]) -> bool:
    """Whether each deployment's router has handed its expected count of requests to replicas."""
    for deployment, count in expected.items():
        async with session.get(stack.url(deployment) + "/v1/replicas") as response:
            table = await response.json()
        if sum(replica["inflight"] for replica in table["replicas"]) != count:
            return False
    return True


async def test_sigterm_of_local_mode_under_load_finishes_every_accepted_request(chaos_processes, chaos_report):
    path = write_documents(chaos_processes.folder / "drain.yaml", [
        manifest("unary", "handlers:Models", replicas=1, gracefulShutdownTimeoutSeconds=GRACE_S,
                 multiplexing={"prewarm": ["m0"]}),
        manifest("stream", "handlers:Stream", replicas=1, gracefulShutdownTimeoutSeconds=GRACE_S),
    ])
    stack = start_local(chaos_processes, path, 2)
    async with aiohttp.ClientSession() as session:
        unary = [asyncio.create_task(request(session, stack.url("unary") + "/", "m0", {"work": 6.0}))
                 for _ in range(8)]
        streams = [asyncio.create_task(stream(session, stack.url("stream") + "/")) for _ in range(4)]
        await wait_until(lambda: all_in_flight(session, stack, {"unary": 8, "stream": 4}),
                         timeout=30, what="all 12 requests accepted and running")
        children = stack.pids()
        stack.proc.popen.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        tally = Tally([*await asyncio.gather(*unary), *await asyncio.gather(*streams)])
        answered_in = time.monotonic() - stopping
    exit_code = await asyncio.to_thread(stack.proc.popen.wait, GRACE_S * 2 + 20)
    exited_in = time.monotonic() - stopping
    chaos_report(tally.line(f"SIGTERM of modelplex local (8 unary of ~6 s, 4 streams of ~7.5 s; grace {GRACE_S} s)",
                            exited_in, answered_within=f"{answered_in:.1f}s"))
    assert not tally.lost, [o.error for o in tally.lost]
    assert tally.by_status() == {"200": tally.sent}
    for outcome in tally.outcomes[8:]:
        records = [json.loads(line) for line in outcome.body.splitlines()]
        assert [r.get("chunk") for r in records] == list(range(CHUNKS)), records[-2:]
    assert exit_code == 0
    assert len(children) >= 4 and not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert exited_in < GRACE_S + 10
