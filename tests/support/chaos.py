"""Faults under load for the chaos suite: bounded load loops, replica processes by name, and the
one-line report each test writes (requests sent, lost, answered by status, recovery time)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from modelplex.processes import wait_for_async

from support.stacks import Stack

MODEL_ID_HEADER = "serve_multiplexed_model_id"


@dataclass
class Outcome:
    started: float  # monotonic
    seconds: float
    status: int | None  # None: no HTTP answer (a transport error, or the client's own timeout)
    body: bytes = b""
    error: str = ""


@dataclass
class Tally:
    """What a stretch of load came to."""

    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return len(self.outcomes)

    @property
    def lost(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status is None]

    def by_status(self) -> dict[str, int]:
        counts = Counter("none" if o.status is None else str(o.status) for o in self.outcomes)
        return dict(sorted(counts.items()))

    def statuses(self) -> set[int | None]:
        return {o.status for o in self.outcomes}

    def max_seconds(self) -> float:
        return max((o.seconds for o in self.outcomes), default=0.0)

    def line(self, fault: str, recovery_s: float | None, **extra) -> str:
        recovery = "n/a" if recovery_s is None else f"{recovery_s:.1f}s"
        more = "".join(f" {k}={v}" for k, v in extra.items())
        return (f"{fault}: sent={self.sent} lost={len(self.lost)} answered={self.by_status()} "
                f"recovery={recovery}{more}")


async def request(session: aiohttp.ClientSession, url: str, model: str, body: dict | None = None, *,
                  timeout_s: float = 60.0) -> Outcome:
    started = time.monotonic()
    headers = {MODEL_ID_HEADER: model} if model else {}
    try:
        async with session.post(url, json=body or {}, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            data = await response.read()
            return Outcome(started, time.monotonic() - started, response.status, data)
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        return Outcome(started, time.monotonic() - started, None, error=repr(error))


async def load(session: aiohttp.ClientSession, url: str, models: list[str], *, clients: int, seconds: float,
               body: dict | None = None, tally: Tally | None = None, timeout_s: float = 60.0,
               stop: asyncio.Event | None = None) -> Tally:
    """``clients`` closed loops sending requests for ``models`` in turn for ``seconds`` (or until
    ``stop``); each loop waits for its answer before sending the next, so the count is bounded."""
    tally = tally if tally is not None else Tally()
    deadline = time.monotonic() + seconds

    async def client(index: int) -> None:
        n = index
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            tally.outcomes.append(await request(session, url, models[n % len(models)], body, timeout_s=timeout_s))
            n += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return tally


def replica_pids(stack: Stack) -> dict[int, int]:
    """``{replica port: pid}`` of a ``modelplex local`` run's replicas."""
    found = {}
    for pid in stack.pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"replica" in argv and b"--port" in argv:
            found[int(argv[argv.index(b"--port") + 1])] = pid
    return found


async def ready_replicas(session: aiohttp.ClientSession, router_url: str) -> int:
    try:
        async with session.get(router_url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as response:
            return int((await response.json()).get("ready_replicas", 0))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return 0


async def wait_for_replicas(session: aiohttp.ClientSession, router_url: str, count: int, *,
                            timeout_s: float = 90.0) -> float:
    """Seconds until the router counts ``count`` ready replicas (bounded)."""
    started = time.monotonic()

    async def enough() -> bool:
        return await ready_replicas(session, router_url) >= count

    await wait_for_async(enough, timeout_s, 0.1, f"the router to see {count} ready replicas")
    return time.monotonic() - started
