"""Fair order between models at the router: model A flooded, model B called by one client.

    .venv/bin/python bench/fairness/run.py [--rounds 3] [--seconds 8]

Two stacks of real processes on loopback (2 replicas and a router each), one whose router
serves waiting requests in weighted fair order between models (the default) and one first
come, first served (``MODELPLEX_ROUTING_QUEUE_ORDER=fifo``). In each round and for each
stack (the stacks alternate, which goes first too): A alone at concurrency 64, B alone at
concurrency 1, then both at once; B's p99 latency and A's throughput come from each phase.
The replicas' slots (``--max-ongoing`` each) are far fewer than A's 64 clients, so most of
A's requests wait in the router's queue, where the order is decided. A model load costs
``--load-s`` and an inference ``--infer-s`` of waiting (as on a GPU), so the numbers show
queueing, not this machine's CPU. Bounded by ``--rounds`` x ``--seconds`` (6 phases of
``--seconds`` per round). Prints markdown: each phase, then the medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "router"))
from bench_router import MODEL_ID_HEADER, Stack, metric, table, write_manifest  # noqa: E402  (the router bench's stack)

ORDERS = ("fair", "fifo")


@dataclass
class Phase:
    """One phase's answers: per model, the latencies of its 200s and its other answers."""

    seconds: float = 0.0
    retries: float = 0.0  # the router's retries (a replica answered 503: its slots were full)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"A": [], "B": []})
    errors: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})

    def p99_ms(self, model: str) -> float:
        values = sorted(self.latencies[model])
        return values[min(len(values) - 1, int(len(values) * 0.99))] * 1000 if values else float("nan")

    def rate(self, model: str) -> float:
        return len(self.latencies[model]) / self.seconds if self.seconds else float("nan")


async def drive(url: str, clients: dict[str, int], seconds: float) -> Phase:
    """``clients[model]`` closed-loop clients per model for ``seconds``."""
    phase = Phase()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def client(model: str) -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    async with session.post(url + "/", json={"x": 1}, headers={MODEL_ID_HEADER: model}) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    phase.latencies[model].append(time.perf_counter() - started)
                else:
                    phase.errors[model] += 1
                    await asyncio.sleep(0.05)  # a refused client backs off a little, as a real one would

        retried = await metric(session, url, "modelplex_router_retries_total")
        started = time.perf_counter()
        await asyncio.gather(*(client(model) for model, n in clients.items() for _ in range(n)))
        phase.seconds = time.perf_counter() - started
        phase.retries = await metric(session, url, "modelplex_router_retries_total") - retried
    return phase


def run_round(stack: Stack, flood: int, seconds: float) -> dict[str, Phase]:
    return {
        "A alone": asyncio.run(drive(stack.router_url, {"A": flood}, seconds)),
        "B alone": asyncio.run(drive(stack.router_url, {"B": 1}, seconds)),
        "A + B": asyncio.run(drive(stack.router_url, {"A": flood, "B": 1}, seconds)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, what in (("--rounds", int, 3, "rounds (each stack once per round)"),
                                      ("--seconds", float, 8.0, "seconds per phase"),
                                      ("--flood", int, 64, "model A's concurrency"),
                                      ("--max-ongoing", int, 8, "slots per replica"),
                                      ("--load-s", float, 0.2, "seconds a model load takes"),
                                      ("--infer-s", float, 0.1, "seconds an inference takes")):
        parser.add_argument(flag, type=kind, default=default, help=what)
    args = parser.parse_args(argv)

    env = {**os.environ, "BENCH_LOAD_S": str(args.load_s), "BENCH_INFER_S": str(args.infer_s)}
    results: dict[str, list[dict[str, Phase]]] = {order: [] for order in ORDERS}
    rows = []
    with tempfile.TemporaryDirectory(prefix="modelplex-fairness-") as tmp:
        stacks = {}
        try:
            for order in ORDERS:
                folder = Path(tmp) / order  # each stack's logs in a folder of its own
                folder.mkdir()
                manifest = write_manifest(folder, 2, 4, args.max_ongoing)
                stacks[order] = Stack(manifest, 2, "cache-aware",
                                      {**env, "MODELPLEX_ROUTING_QUEUE_ORDER": order}).__enter__()
                asyncio.run(drive(stacks[order].router_url, {"A": args.flood, "B": 1}, 2.0))  # warm: A spread, B loaded
            for i in range(args.rounds):
                for order in ORDERS if i % 2 == 0 else ORDERS[::-1]:
                    print(f"round {i + 1}, {order} ...", file=sys.stderr, flush=True)
                    phases = run_round(stacks[order], args.flood, args.seconds)
                    results[order].append(phases)
                    for name, phase in phases.items():
                        rows.append([str(i + 1), order, name, f"{phase.rate('A'):.1f}", f"{phase.p99_ms('B'):.1f}",
                                     f"{phase.errors['A']}/{phase.errors['B']}", f"{phase.retries:.0f}"])
        finally:
            for stack in stacks.values():
                stack.__exit__()

    print(f"\n2 replicas x maxOngoingRequests {args.max_ongoing}; A at concurrency {args.flood}, B at 1; "
          f"inference {args.infer_s * 1000:.0f} ms, load {args.load_s * 1000:.0f} ms; {args.rounds} rounds of "
          f"{args.seconds:g} s phases\n")
    print(table(["round", "order", "phase", "A req/s", "B p99 ms", "A/B non-200", "router retries"], rows))
    print("\nMedians over the rounds\n")
    summary = []
    for order in ORDERS:
        def median(phase: str, value) -> float:
            return statistics.median(value(r[phase]) for r in results[order])

        b_alone, b_flood = median("B alone", lambda p: p.p99_ms("B")), median("A + B", lambda p: p.p99_ms("B"))
        a_alone, a_with = median("A alone", lambda p: p.rate("A")), median("A + B", lambda p: p.rate("A"))
        summary.append([order, f"{b_alone:.1f}", f"{b_flood:.1f}", f"{b_flood / b_alone:.2f}x",
                        f"{a_alone:.1f}", f"{a_with:.1f}", f"{a_with / a_alone:.0%}"])
    print(table(["order", "B p99 alone ms", "B p99 under A's flood ms", "ratio", "A req/s alone",
                 "A req/s beside B", "A share"], summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
