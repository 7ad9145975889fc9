"""The real ModelCache on workload 2's trace, on a virtual clock: hit rates that no machine load moves.

    .venv/bin/python bench/compare/cache_sim.py [--requests 2000] [--slots 8] [--clients 16]

The end-to-end run (``cache_policies.py``) measures the servers too, and on a shared machine its
hit rates move by several points from run to run. Here ``modelplex.cache.ModelCache`` itself
serves the same Zipf trace on looptime's virtual clock: 16 closed-loop clients take the next
request from one cursor; each pins its model, gets it (a miss is a load of ``--load-ms``,
the 100 ms fetch plus construction of workload 2) and holds it for ``--serve-ms``. One cache of
``--slots`` models, so Belady's optimum for that many slots is the ceiling. Hit rate =
1 - loads / requests, as in ``run.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import looptime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import belady  # noqa: E402

from modelplex.cache import ModelCache  # noqa: E402

CONFIGS = [("lru", None), ("lru", 1), ("lru", 2), ("lru", 4), ("lfu", None), ("lfu", 1), ("lfu", 2), ("lfu", 4)]


async def serve(trace: list[str], slots: int, clients: int, load_s: float, serve_s: float, policy: str,
                max_loads: int | None) -> dict:
    loads = 0

    def count(event: str, model_id: str, seconds: float) -> None:
        nonlocal loads
        loads += event == "loaded"

    async def load(model_id: str) -> str:
        await asyncio.sleep(load_s)
        return model_id

    cache = ModelCache(load, slots, policy=policy, max_concurrent_loads=max_loads, listener=count,
                       clock=asyncio.get_running_loop().time)
    cursor = 0
    latencies: list[float] = []
    loop = asyncio.get_running_loop()

    async def client() -> None:
        nonlocal cursor
        while cursor < len(trace):
            model_id = trace[cursor]
            cursor += 1
            started = loop.time()
            with cache.pinned(model_id):
                await cache.get(model_id)
                await asyncio.sleep(serve_s)
            latencies.append(loop.time() - started)

    started = loop.time()
    await asyncio.gather(*(client() for _ in range(clients)))
    seconds = loop.time() - started
    latencies.sort()
    await cache.close()
    return {"hit_rate": 1 - loads / len(trace), "loads": loads, "rps": len(trace) / seconds,
            "p50_ms": latencies[len(latencies) // 2] * 1000, "p99_ms": latencies[int(0.99 * len(latencies))] * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    belady.add_trace_arguments(parser)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--load-ms", type=float, default=120.0)
    parser.add_argument("--serve-ms", type=float, default=5.0)
    args = parser.parse_args()
    trace = belady.zipf_trace(args.requests, args.models, args.zipf, seed=0)
    ceiling = belady.belady_hits(trace, args.slots) / len(trace)
    print(f"{len(trace)} requests, {len(set(trace))} models, Zipf({args.zipf}), one cache of {args.slots}, "
          f"{args.clients} clients, loads {args.load_ms:g} ms, serving {args.serve_ms:g} ms (virtual time); "
          f"offline: Belady({args.slots}) {ceiling:.3f}, LRU({args.slots}) "
          f"{belady.lru_hits(trace, args.slots) / len(trace):.3f}")
    print(f"{'policy':8s} {'loads at once':>13s} {'hit rate':>8s} {'of Belady':>9s} {'loads':>6s} {'req/s':>7s} "
          f"{'p50 ms':>7s} {'p99 ms':>7s}")
    for policy, max_loads in CONFIGS:
        loop = looptime.new_event_loop(start=0, noop_cycles=0)
        try:
            row = loop.run_until_complete(serve(trace, args.slots, args.clients, args.load_ms / 1000,
                                                args.serve_ms / 1000, policy, max_loads))
        finally:
            loop.close()
        print(f"{policy:8s} {str(max_loads or 'any'):>13s} {row['hit_rate']:8.3f} {row['hit_rate'] / ceiling:9.0%} "
              f"{row['loads']:6d} {row['rps']:7.1f} {row['p50_ms']:7.0f} {row['p99_ms']:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
