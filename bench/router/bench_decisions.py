"""Routing-decision micro-benchmark: the policy's decision for a held model (hit) and for a model
no replica holds (miss), at pool sizes from 10 replicas x 100 models to 1,000 x 10,000, read
from the routing table's index; and the table's memory per replica and per model.

    .venv/bin/python bench/router/bench_decisions.py [--sizes 10x100,100x1000,1000x10000] [--decisions 20000]

Each replica holds ``capacity`` (10) models, spread so that every model of the pool is held by
about ``replicas x capacity / models`` replicas (1 at the sizes above), half the replicas busy
(2 of 4 slots). A decision is :func:`modelplex_router.policy.choose` over
``RoutingTable.pool(now)`` (what the scheduler calls), one thread, no I/O. ``--baseline``
also times the policy of another commit (``git show REV:router/modelplex_router/policy.py``)
over the table's list of usable replicas, interleaved with ours, for comparison.
Prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import ModuleType
from typing import Callable

from modelplex.wire.loaded import LoadedModels
from modelplex_router.events import ReplicaSeen
from modelplex_router.policy import Params, choose
from modelplex_router.record import Held
from modelplex_router.table import RoutingTable

PARAMS = Params(max_ongoing=4, matching_timeout_s=1.0)
CAPACITY = 10
NOW = 1000.0
REPO = Path(__file__).resolve().parents[2]


def build(replicas: int, models: int, capacity: int = CAPACITY) -> RoutingTable:
    """A table of ``replicas`` ready replicas, replica i holding models (i*capacity + k) mod models."""
    table = RoutingTable()
    for i in range(replicas):
        held = tuple(f"model-{(i * capacity + k) % models}" for k in range(capacity))
        table.apply(ReplicaSeen(f"replica-{i}", f"http://127.0.0.{i % 250 + 2}:{8000 + i // 250}", True,
                                Held.of(LoadedModels(1, capacity, held))), NOW)
        table.get(f"replica-{i}").in_slots = 2 if i % 2 else 0
    return table


def time_decisions(decide: Callable[[str], object], names: list[str]) -> list[float]:
    """Microseconds per decision, one per name."""
    out = []
    clock = time.perf_counter_ns
    for name in names:
        start = clock()
        decide(name)
        out.append((clock() - start) / 1000)
    return out


def p50(samples: list[float]) -> float:
    return round(statistics.median(samples), 2)


def memory(replicas: int, models: int) -> tuple[float, float]:
    """Bytes the table takes per replica (no models) and per (model, holder) entry."""
    def taken(capacity: int) -> int:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        table = build(replicas, models, capacity)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del table
        return after - before

    empty = taken(0)
    full = taken(CAPACITY)
    return empty / replicas, (full - empty) / (replicas * CAPACITY)


def load_baseline(rev: str) -> ModuleType:
    source = subprocess.run(["git", "show", f"{rev}:router/modelplex_router/policy.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_policy.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_policy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_policy"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(replicas: int, models: int, decisions: int, baseline: ModuleType | None) -> dict:
    table = build(replicas, models)
    rng = random.Random(0)
    hits = [f"model-{rng.randrange(min(models, replicas * CAPACITY))}" for _ in range(decisions)]
    misses = [f"new-{k}" for k in range(decisions)]

    def ours(model: str) -> object:
        return choose(table.pool(NOW), model, PARAMS, rng=rng)

    result: dict = {"replicas": replicas, "models": models}
    rounds = 3  # interleaved with the baseline, medians over all rounds
    ours_hit: list[float] = []
    ours_miss: list[float] = []
    base_hit: list[float] = []
    base_miss: list[float] = []
    for _ in range(rounds):
        ours_hit += time_decisions(ours, hits[: decisions // rounds])
        ours_miss += time_decisions(ours, misses[: decisions // rounds])
        if baseline is not None:
            usable = table.usable(NOW)
            params = baseline.Params(max_ongoing=4, matching_timeout_s=1.0)
            def theirs(model: str) -> object:
                return baseline.choose(usable, model, params, rng=rng)
            count = max(50, decisions // rounds // max(1, replicas // 10))  # the old miss path is slow
            base_hit += time_decisions(theirs, hits[:count])
            base_miss += time_decisions(theirs, misses[:count])
    result["decision_p50_us_hit"] = p50(ours_hit)
    result["decision_p50_us_miss"] = p50(ours_miss)
    result["decision_p99_us_hit"] = round(sorted(ours_hit)[int(len(ours_hit) * 0.99)], 2)
    result["decision_p99_us_miss"] = round(sorted(ours_miss)[int(len(ours_miss) * 0.99)], 2)
    if baseline is not None:
        result["baseline_p50_us_hit"] = p50(base_hit)
        result["baseline_p50_us_miss"] = p50(base_miss)
    per_replica, per_holding = memory(replicas, models)
    result["table_bytes_per_replica"] = round(per_replica)
    result["table_bytes_per_model_holding"] = round(per_holding)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10x100,100x1000,1000x10000")
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--baseline", default="", help="a git revision whose policy to time beside ours")
    args = parser.parse_args()
    baseline = load_baseline(args.baseline) if args.baseline else None
    for size in args.sizes.split(","):
        replicas, models = (int(x) for x in size.split("x"))
        print(json.dumps(run(replicas, models, args.decisions, baseline)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
