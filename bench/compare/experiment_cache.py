"""Workload 2 on Modelplex with other cache eviction policies, to size a proposed change.

    .venv/bin/python bench/compare/experiment_cache.py [--requests 2000] [--policies lru lfu ...]

Runs the multiplexing workload of ``run.py`` (same trace, same deployment, fresh replicas each
time) once per policy. ``lru`` is Modelplex as it is; the others patch the replica's
``ModelCache`` at start-up through ``experiment_site/sitecustomize.py`` (Modelplex's code is
not changed; see that file for what each policy does). Prints hit rates beside the offline
ones (Belady, LRU, and LFU simulated on the same trace).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zlib
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import belady  # noqa: E402
import run  # noqa: E402
from handlers import MUX_SLOTS  # noqa: E402

POLICIES = ("lru", "lfu", "evict-after-load", "lfu-after-load", "lru-bounded", "lfu-bounded",
            "lfu-after-load-bounded")


def offline_lfu(trace: list[str], capacity: int, parts: int = 1) -> float:
    """LFU with counts kept across evictions, the trace split over ``parts`` caches by a hash
    of the model id (as a router pins new models to replicas); ties: the older entry."""
    caches: list[list[str]] = [[] for _ in range(parts)]
    counts: Counter[str] = Counter()
    hits = 0
    for model in trace:
        cache = caches[zlib.crc32(model.encode()) % parts]
        counts[model] += 1
        if model in cache:
            hits += 1
            continue
        if len(cache) >= capacity:
            cache.remove(min(cache, key=lambda m: counts[m]))
        cache.append(model)
    return hits / len(trace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--max-loads", type=int, default=0,
                        help="loads at once per replica for the *-bounded policies (default capacity // 2)")
    args = parser.parse_args()
    settings = run.settings_for(argparse.Namespace(quick=False, seconds=6.0, rounds=1))
    settings.mux_requests = args.requests
    trace = run.mux_trace(settings)
    slots = run.MUX["replicas"] * MUX_SLOTS
    print(f"trace: {len(trace)} requests, {len(set(trace))} models; offline hit rates: "
          f"Belady(8) {belady.belady_hits(trace, slots) / len(trace):.3f}, LRU(8) {belady.lru_hits(trace, slots) / len(trace):.3f}, "
          f"LFU(8) {offline_lfu(trace, slots):.3f}, LFU(2 x 4, hashed) {offline_lfu(trace, MUX_SLOTS, 2):.3f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="modelplex-experiment-") as tmp:
        for policy in args.policies:
            extra = {}
            if policy != "lru":
                extra = {"BENCH_CACHE_POLICY": policy, "BENCH_MAX_LOADS": str(args.max_loads),
                         "PYTHONPATH": os.pathsep.join([str(HERE / "experiment_site"), str(HERE)])}
            entry = run.mux_modelplex(settings, Path(tmp), trace, extra_env=extra, overhead=False)
            rows.append((policy, entry))
            label = f"{policy} ({args.max_loads or MUX_SLOTS // 2})" if policy.endswith("bounded") else policy
            print(f"{label:18s} hit rate {entry['hit_rate']:.3f}  loads {entry['loads']}  "
                  f"top-4 loads {entry['top4_loads']}  loads at once {entry['loads_in_flight_mean']:.2f} "
                  f"(max {entry['loads_in_flight_max']})  {entry['rps']:.1f} req/s  p50 {entry['p50_ms']:.0f} ms  "
                  f"p99 {entry['p99_ms']:.0f} ms  load avg {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
