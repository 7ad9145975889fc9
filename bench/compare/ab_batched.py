"""Workload 1's batched MLP at concurrency 32 (or, with ``--workload multiplexing``, workload 2's
Zipf trace over 40 models on 2 replicas; with ``--workload streaming``, workload 3's NDJSON
streams), through router and replica, on two checkouts of
Modelplex (A: before a change, B: after it), interleaved: is B within 5% of A?

    git worktree add --detach /tmp/bench-old ae28ec5; git worktree add --detach /tmp/bench-new HEAD
    .venv/bin/python bench/compare/ab_batched.py --a /tmp/bench-old --b /tmp/bench-new [--runs 5] [--seconds 10] [--cpus 2]

Each run starts ``modelplex local`` from one checkout (as ``run.py --tree`` does: its packages
first on the path, its folder the working directory), serves the very same handler
(``handlers.py``'s ``BatchedMLP``, 32 rows, 2 ms), warms up, then measures 32 closed-loop
clients. Runs alternate A B B A A B ..., so background load that drifts reaches both alike
(one run on these shared 2-core machines varies by more than 5%); the verdict is on the
medians. Each run's load average and outside CPU are recorded beside it. ``--cpus N`` runs
the stacks in a cgroup with an N-core quota and a weight above other sessions', and this
process in another (``cgroups.py``), so other people's load moves the numbers less. Prints a
markdown table; ``--out`` also gets the numbers as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cgroups  # noqa: E402
import loadgen  # noqa: E402
import run  # noqa: E402
from handlers import GPU_MLP_SIZES, MLP_SIZES, STREAM_CHUNKS  # noqa: E402


def commit(tree: Path) -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%h %s"], cwd=tree, capture_output=True, text=True, timeout=10)
    return out.stdout.strip()[:90]


def cpu_seconds(pids: dict[int, str]) -> dict[str, float]:
    """CPU time (user + system) used so far, summed per role (router, replica)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for pid, role in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def context_switches(pids: dict[int, str], role: str) -> int:
    """Context switches (voluntary: a thread waited, for a wake-up or the GIL; involuntary: it
    was preempted) of the ``role`` processes' threads so far: how many hand-overs a request costs."""
    total = 0
    for pid in (p for p, r in pids.items() if r == role):
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                status = Path(f"/proc/{pid}/task/{thread}/status").read_text()
            except OSError:
                continue
            total += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return total


def one_run(tree: Path, workdir: Path, name: str, args: argparse.Namespace, monitor: run.Monitor) -> dict:
    run.product_root = tree
    if args.workload == "multiplexing":
        return one_multiplexing_run(workdir, name, args, monitor)
    if args.workload == "streaming":
        return one_streaming_run(workdir, name, args, monitor)
    spec = {"replicas": 1, "handler": f"mp_handlers:{args.handler}", "maxOngoingRequests": args.max_ongoing}
    body = run.mlp_body((GPU_MLP_SIZES if args.handler == "GPUBatchedMLP" else MLP_SIZES)[0])
    with monitor.phase(name), run.ModelplexStack(workdir, name, spec, run.bench_env()) as stack:
        asyncio.run(loadgen.unary(stack.url, body, args.concurrency, args.warmup, warmup_s=0))
        pids = stack.pids()
        before, switches = cpu_seconds(pids), context_switches(pids, "replica")
        point = asyncio.run(loadgen.unary(stack.url, body, args.concurrency, args.seconds, warmup_s=0))
        after, switches = cpu_seconds(pids), context_switches(pids, "replica") - switches
    s = point.summary()
    phase = monitor.summary()[-1]
    # CPU per answer does not depend on the share of the cores a run got: the steadier measure
    # of cost on a machine that others load.
    cpu_ms = {role: round((after[role] - before.get(role, 0.0)) / max(point.ok, 1) * 1000, 3)
              for role in ("router", "replica") if role in after}
    return {"rps": s["rps"], "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "errors": s["errors"],
            "cpu_ms_per_request": cpu_ms, "replica_switches_per_request": round(switches / max(point.ok, 1), 2),
            "load1": round(phase["load"][0], 2), "other_cores": phase["other_cores"]}


def one_streaming_run(workdir: Path, name: str, args: argparse.Namespace, monitor: run.Monitor) -> dict:
    """Workload 3 (``run.py``'s streaming, Modelplex alone) at one concurrency: 20-record NDJSON
    streams, 10 ms apart, 2 replicas; ``rps`` is streams/s, and time to first chunk beside it."""
    spec = {"replicas": 2, "handler": "mp_handlers:Streamer", "maxOngoingRequests": max(args.max_ongoing, 256)}
    env = run.bench_env({"BENCH_STREAM_INTERVAL_S": "0.01"})
    with monitor.phase(name), run.ModelplexStack(workdir, name, spec, env) as stack:
        pids = stack.pids()
        before = cpu_seconds(pids)
        point = asyncio.run(loadgen.streams(stack.url, {"chunks": STREAM_CHUNKS}, STREAM_CHUNKS, args.concurrency,
                                            args.seconds, warmup_s=args.warmup))
        after = cpu_seconds(pids)
    s = point.summary()
    phase = monitor.summary()[-1]
    cpu_ms = {role: round((after[role] - before.get(role, 0.0)) / max(point.ok, 1) * 1000, 3)
              for role in ("router", "replica") if role in after}
    return {"rps": s["rps"], "p50_ms": s.get("ttfc_p50_ms", float("nan")), "p99_ms": s.get("ttfc_p99_ms", float("nan")),
            "errors": s["errors"], "cpu_ms_per_request": cpu_ms,
            "load1": round(phase["load"][0], 2), "other_cores": phase["other_cores"]}


def one_multiplexing_run(workdir: Path, name: str, args: argparse.Namespace, monitor: run.Monitor) -> dict:
    """Workload 2's trace (``run.py``'s multiplexing, Modelplex alone) from empty caches."""
    settings = SimpleNamespace(mux_requests=args.requests, mux_concurrency=args.concurrency,
                               mux_max_seconds=args.seconds * 6)
    with monitor.phase(name):
        entry = run.mux_modelplex(settings, workdir, run.mux_trace(settings), overhead=False)
    phase = monitor.summary()[-1]
    return {"rps": entry["rps"], "p50_ms": entry["p50_ms"], "p99_ms": entry["p99_ms"], "errors": entry["errors"],
            "hit_rate": round(entry["hit_rate"], 4), "cpu_ms_per_request": {},
            "load1": round(phase["load"][0], 2), "other_cores": phase["other_cores"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="checkout before the change")
    parser.add_argument("--b", type=Path, required=True, help="checkout after the change")
    parser.add_argument("--runs", type=int, default=5, help="runs of each (at least 3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-ongoing", type=int, default=128, help="as workload 1 sets it")
    parser.add_argument("--workload", default="batched", choices=["batched", "multiplexing", "streaming"],
                        help="streaming: workload 3 at --concurrency, streams/s, and its p50/p99 are time to first chunk")
    parser.add_argument("--requests", type=int, default=400, help="multiplexing: requests in the trace")
    parser.add_argument("--handler", default="BatchedMLP", choices=["BatchedMLP", "BatchedEcho", "GPUBatchedMLP"],
                        help="BatchedEcho: the same batching with no model, to see the per-request cost alone")
    parser.add_argument("--cpus", type=float, default=0.0,
                        help="run the stacks in a cgroup with this CPU quota and a weight above other sessions' "
                             "(run.py --cpus), the load generator in another: less noise from other people's load")
    parser.add_argument("--shared-cpus", type=int, default=0, metavar="N",
                        help="a small machine on any machine: the load generator and both systems share one "
                             "cgroup of N CPUs (quota and cpuset), as on an N-core machine (overrides --cpus)")
    parser.add_argument("--out", type=Path, help="write the runs and medians here as JSON")
    args = parser.parse_args(argv)
    if args.workload == "multiplexing" and "--concurrency" not in (argv or sys.argv):
        args.concurrency = 16  # run.py's workload 2
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    for tree in trees.values():
        if not any((tree / path).exists() for path in run.CLI_PATHS.values()):
            parser.error(f"{tree}: not a Modelplex checkout")
    order = [("A", "B") if i % 2 == 0 else ("B", "A") for i in range(args.runs)]
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    groups = nullcontext()
    if args.cpus > 0 or args.shared_cpus:
        why_not = cgroups.available()
        if why_not:
            parser.error(f"--cpus: {why_not}")
        groups = run.cpu_groups = cgroups.Groups(args.shared_cpus or args.cpus, shared=bool(args.shared_cpus))
    with groups, run.Monitor() as monitor, tempfile.TemporaryDirectory(prefix="modelplex-ab-") as tmp:
        for i, pair in enumerate(order):
            for label in pair:
                result = one_run(trees[label], Path(tmp), f"ab-{label.lower()}-{i}", args, monitor)
                runs[label].append(result)
                run.log(f"run {i + 1} {label}: {result['rps']:7.1f} req/s  p50 {result['p50_ms']:6.1f}  "
                        f"p99 {result['p99_ms']:6.1f} ms  errors {result['errors']}  load {result['load1']:.2f}  "
                        f"others {result['other_cores']:.2f} cores")
    medians = {k: {m: statistics.median(r[m] for r in v) for m in ("rps", "p50_ms", "p99_ms")} for k, v in runs.items()}
    for k, v in runs.items():
        for role in ("router", "replica"):
            medians[k][f"{role}_cpu_ms"] = statistics.median(r["cpu_ms_per_request"].get(role, float("nan")) for r in v)
        medians[k]["replica_switches"] = statistics.median(r.get("replica_switches_per_request", float("nan")) for r in v)
    ratio = medians["B"]["rps"] / medians["A"]["rps"]
    # Runs i of A and B ran back to back: their ratio cancels the load that drifted between pairs.
    paired = statistics.median(b["rps"] / a["rps"] for a, b in zip(runs["A"], runs["B"]))
    summary = {"command": "python bench/compare/ab_batched.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               "trees": {k: {"path": str(v), "commit": commit(v)} for k, v in trees.items()},
               "workload": args.workload, "handler": args.handler, "concurrency": args.concurrency, "seconds": args.seconds,
               "cpu_groups": run.cpu_groups.describe() if run.cpu_groups is not None else None,
               "order": order, "runs": runs,
               "medians": medians, "ratio_b_over_a": round(ratio, 4), "paired_ratio_median": round(paired, 4),
               "within_5_percent": ratio >= 0.95}
    print(markdown(summary))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def workload_name(summary: dict) -> str:
    if summary.get("workload") == "multiplexing":
        mux = run.MUX
        return f"multiplexing trace ({mux['models']} models, Zipf {mux['zipf']}, {mux['replicas']} replicas)"
    if summary.get("workload") == "streaming":
        return f"streaming ({STREAM_CHUNKS} NDJSON records 10 ms apart, 2 replicas; req/s = streams/s, p99 = time to first chunk)"
    return summary.get("handler", "BatchedMLP")


def markdown(summary: dict) -> str:
    groups = summary.get("cpu_groups")
    lines = [f"A = `{summary['trees']['A']['commit']}`, B = `{summary['trees']['B']['commit']}`; "
             f"{workload_name(summary)}, c={summary['concurrency']}, {summary['seconds']:g} s per run; "
             "order "
             + " ".join("".join(p) for p in summary["order"])
             + (f"; CPU groups: {'; '.join(groups['groups'])}" if groups else "; no CPU groups"), "",
             "| run | A req/s | A p99 ms | A CPU ms/req (router + replica) | B req/s | B p99 ms "
             "| B CPU ms/req (router + replica) | B / A | load avg (A / B) | others' cores (A / B) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    a, b = summary["runs"]["A"], summary["runs"]["B"]

    def cpu(r: dict) -> str:
        c = r["cpu_ms_per_request"]
        return f"{c.get('router', float('nan')):.2f} + {c.get('replica', float('nan')):.2f}"

    for i, (x, y) in enumerate(zip(a, b)):
        lines.append(f"| {i + 1} | {x['rps']:.1f} | {x['p99_ms']:.1f} | {cpu(x)} | {y['rps']:.1f} | {y['p99_ms']:.1f} | "
                     f"{cpu(y)} | {y['rps'] / x['rps']:.3f} | {x['load1']:.2f} / {y['load1']:.2f} | "
                     f"{x['other_cores']:.2f} / {y['other_cores']:.2f} |")
    ma, mb = summary["medians"]["A"], summary["medians"]["B"]
    lines.append(f"| **median** | **{ma['rps']:.1f}** | {ma['p99_ms']:.1f} | "
                 f"{ma['router_cpu_ms']:.2f} + {ma['replica_cpu_ms']:.2f} | **{mb['rps']:.1f}** | {mb['p99_ms']:.1f} | "
                 f"{mb['router_cpu_ms']:.2f} + {mb['replica_cpu_ms']:.2f} | {summary['paired_ratio_median']:.3f} | | |")
    errors = sum(r["errors"] for r in a + b)
    lines += ["", f"B / A of the medians: **{summary['ratio_b_over_a']:.3f}** "
              f"({'within' if summary['within_5_percent'] else 'NOT within'} 5%); median of the paired ratios "
              f"{summary['paired_ratio_median']:.3f}; replica CPU per request B / A "
              f"{mb['replica_cpu_ms'] / ma['replica_cpu_ms']:.3f}; replica context switches per request "
              f"A {ma.get('replica_switches', float('nan')):.2f} / B {mb.get('replica_switches', float('nan')):.2f}; "
              f"errors in all runs: {errors}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
