"""Checks of the benchmark's offline parts (no servers): ``pytest bench/compare``."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import belady  # noqa: E402
import report  # noqa: E402


def test_belady_is_optimal_on_small_traces():
    rng = random.Random(3)
    for _ in range(200):
        trace = [rng.choice("abcde") for _ in range(rng.randint(1, 12))]
        capacity = rng.randint(1, 3)
        assert belady.belady_hits(trace, capacity) == belady._brute_belady(trace, capacity)
        assert belady.lru_hits(trace, capacity) <= belady.belady_hits(trace, capacity)


def test_belady_counts_compulsory_misses():
    assert belady.belady_hits(["a", "b", "a", "b"], 2) == 2
    assert belady.belady_hits(["a", "b", "c", "a"], 2) == 1  # evicts b (never used again), keeps a


def test_zipf_trace_is_deterministic_and_skewed():
    trace = belady.zipf_trace(5000, 40, 1.1, seed=0)
    assert trace == belady.zipf_trace(5000, 40, 1.1, seed=0)
    assert trace.count("model-01") > trace.count("model-10") > trace.count("model-40")


def _results() -> dict:
    point = lambda rps, p99: {"rps": rps, "p50_ms": p99 / 2, "p99_ms": p99, "errors": 0, "error_kinds": {}}
    stream = lambda rps, ttfc: {**point(rps, 300.0), "ttfc_p50_ms": ttfc / 2, "ttfc_p99_ms": ttfc, "chunks_per_s": rps * 20}
    sweep = lambda f: {mode: {str(c): point(f * c, 100.0) for c in (1, 32)} for mode in ("unbatched", "batched")}
    return {
        "command": "python bench/compare/run.py --quick", "started": "now", "wall_s": 1.0,
        "environment": {"cores": 2, "cpu": "x", "memory_gb": 24, "platform": "linux", "gpu": None, "python": "3.11",
                        "torch": "2", "ray": "2.60.0", "aiohttp": "3", "modelplex": "0.1.0", "commit": "abc",
                        "commit_subject": "s", "tree_dirty_outside_bench": 0},
        "load_wait": None, "ray_start_s": [5.0],
        "load": [{"when": "x", "load": (0.5, 0.5, 0.5), "seconds": 3.0, "busy_cores": 1.5, "our_cores": 1.2, "other_cores": 0.3}],
        "settings": {"quick": True}, "batch": {"max_batch_size": 32, "batch_wait_timeout_s": 0.002},
        "compute_bound": {str(b): {"passes_per_s": 100.0, "rows_per_s": 100.0 * b, "ms_per_pass": 10.0} for b in (1, 8, 32)},
        "batching": {"Ray Serve": sweep(1.0), "Modelplex": sweep(6.0)},
        "batching_latencies": {s: {m: {"32": [0.01, 0.02]} for m in ("unbatched", "batched")} for s in ("Ray Serve", "Modelplex")},
        "multiplexing": {
            "requests": 10, "models": 40, "zipf": 1.1, "replicas": 2, "slots": 4, "fetch_s": 0.1, "concurrency": 16,
            "max_ongoing": 16, "distinct_in_trace": 5,
            "offline": {"belady_global_8": 0.7, "lru_global_8": 0.5, "belady_one_replica_4": 0.5, "static_top_8": 0.68},
            "systems": {s: {"sent": 10, "ok": 10, "errors": 0, "error_kinds": {}, "loads": loads, "hit_rate": 1 - loads / 10,
                            "load_p50_ms": 110.0, "per_replica_loads": [2, 1],
                            "loads_in_flight_mean": 1.5, "loads_in_flight_max": 3, "top4_loads": 2, "seconds": 1.0, "rps": rps, "p50_ms": 5.0,
                            "p90_ms": 6.0, "p99_ms": 9.0, "trace_latencies": [0.01]}
                        for s, loads, rps in (("Ray Serve", 4, 10.0), ("Modelplex", 3, 40.0))}},
        "streaming": {"chunks": 20, "interval_s": 0.01, "replicas": 2, "max_ongoing": 256,
                      "systems": {"Ray Serve": {"8": stream(30, 80.0), "256": stream(100, 2000.0)},
                                  "Modelplex": {"8": stream(38, 8.0), "256": stream(650, 300.0)}},
                      "ttfc": {"Ray Serve": {"8": [0.05], "256": [1.0]}, "Modelplex": {"8": [0.005], "256": [0.2]}}},
        "busy": {"replicas": 1, "max_ongoing": 32, "rows": 48, "chunks": 20, "seconds": 10.0, "rounds": 2,
                 "compute_bound": {"passes_per_s": 110.0, "rows_per_s": 5280.0, "ms_per_pass": 9.1},
                 "systems": {"Ray Serve": {"stream": {"8": stream(3.4, 640.0)}, "unary": {"8": point(90.0, 120.0)}},
                             "Modelplex": {"stream": {"8": {**stream(4.0, 200.0), "server_cores": 0.9,
                                                            "server_cpu_ms_per_answer": 225.0}},
                                           "unary": {"8": {**point(100.0, 90.0), "errors": 2,
                                                           "error_kinds": {"HTTP 503": 2}}}}},
                 "modelplex_health": {m: {"8": {"readyz_p50_ms": 1.0, "readyz_p99_ms": 4.0, "readyz_max_ms": 9.0,
                                                "readyz_probes": 100, "readyz_failed": 0, "not_ready_transitions": 0}}
                                      for m in ("stream", "unary")}},
        "gpu": {"skipped": "skipped: no CUDA device"},
    }


def test_report_writes_tables_targets_and_plots(tmp_path):
    report.write(_results(), tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "skipped: no CUDA device" in text
    assert "| Batching, concurrency 32: throughput >= 5x Ray Serve's, p99 no worse | **met** |" in text
    assert "Multiplexing: hit rate >= 95% of Belady's for the trace | **met** |" in text  # 0.7 / 0.7
    assert "Streaming: time to first chunk p99 at concurrency 8 <= half of Ray Serve's | **met** |" in text
    assert (tmp_path / "results.json").exists()
    for png in ("throughput_vs_concurrency.png", "latency_cdf.png", "hit_rate.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_report_has_the_busy_replica_tables_and_targets(tmp_path):
    report.write(_results(), tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "## 4. Busy replicas" in text
    assert "| 8 | 3.40 | 320.0 | 640.0 | 300.0 | 0 | - | 4.00 | 100.0 | 200.0 | 300.0 | 0 | 0.90 / 225 | 4.0 | 0 |" in text
    assert "| 8 | 90.0 | 60.0 | 120.0 | 0 | - | 100.0 | 45.0 | 90.0 | 2 (HTTP 503: 2) | - | 1.1x | 4.0 | 0 |" in text
    # 2 errors: not met, whatever the latencies; the stream's p99 is 200 <= 640 / 2: met.
    assert "| Busy replicas: Modelplex answers every CPU-bound request and stream (0 errors) | **not met** |" in text
    assert ("| Busy replicas: CPU-bound stream, time to first chunk p99 at concurrency 8 <= half of Ray Serve's "
            "| **met** | 200.0 vs 640.0 ms = 0.31x of Ray Serve's |") in text


def test_a_command_wrapped_for_a_cpu_group_joins_it_first_then_runs_with_its_arguments(tmp_path):
    import subprocess

    import cgroups

    group = cgroups.CpuGroup("system-under-test", 1.0)
    group.path = tmp_path  # a folder standing in for the cgroup: cgroup.procs is a plain file here
    out = subprocess.run(group.wrap([sys.executable, "-c", "import os, sys; print(os.getpid(), sys.argv[1:])",
                                     "a b", "$HOME"]), capture_output=True, text=True, check=True)
    pid, _, argv = out.stdout.strip().partition(" ")
    assert argv == "['a b', '$HOME']"  # arguments pass through the shell untouched
    assert (tmp_path / "cgroup.procs").read_text().strip() == pid  # exec kept the pid that joined
