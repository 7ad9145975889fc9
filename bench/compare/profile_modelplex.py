"""Where Modelplex's CPU goes under one benchmark workload: per-process CPU and py-spy profiles.

    .venv/bin/python bench/compare/profile_modelplex.py batched [--seconds 15] [--concurrency 32]
    .venv/bin/python bench/compare/profile_modelplex.py batched-grpc [--concurrency 64]   (the same through gRPC)
    .venv/bin/python bench/compare/profile_modelplex.py stream  [--concurrency 256]
    .venv/bin/python bench/compare/profile_modelplex.py mux
    .venv/bin/python bench/compare/profile_modelplex.py busy-stream [--concurrency 8] [--tree /tmp/bench-new]
    .venv/bin/python bench/compare/profile_modelplex.py batched --no-spy --gc   (the garbage collector's CPU too)

Starts the same Modelplex deployment as ``run.py`` (``modelplex local``), drives it with the
same load generator, and meanwhile (a) reads each process's CPU time from /proc (the router,
the replicas, this load generator; a server's busiest thread too) and (b) samples the router and the replicas with
``py-spy record --nonblocking`` (raw collapsed stacks). Prints the CPU share of each process
and, per process, the functions with the most samples: self (leaf frame) and inclusive.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import belady  # noqa: E402
import loadgen  # noqa: E402
import run  # noqa: E402
from handlers import BUSY_CHUNKS, MLP_SIZES, MUX_SIZES, STREAM_CHUNKS  # noqa: E402
from run import ModelplexStack, bench_env, mlp_body  # noqa: E402

from modelplex.processes import free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def _stat_cpu_seconds(stat: Path) -> float:
    """utime + stime of a ``/proc/.../stat`` file; 0 when it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pid: int) -> float:
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """Each thread's CPU seconds of process ``pid``, by thread id."""
    return {int(task.name): _stat_cpu_seconds(task / "stat") for task in Path(f"/proc/{pid}/task").glob("*")}


def gc_totals(folder: Path, pid: int) -> list[tuple[int, float]]:
    """A process's garbage collections and their CPU seconds so far, per generation, as it last
    wrote them (``experiment_site``'s ``BENCH_GC_LOG``); zeros when it wrote none."""
    try:
        numbers = (folder / f"gc.{pid}").read_text().split()
    except OSError:
        return [(0, 0.0)] * 3
    return [(int(numbers[i]), float(numbers[i + 1])) for i in range(0, 6, 2)]


def summarize(raw: Path, top: int) -> list[str]:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        self_counts[_short(frames[-1])] += n
        for name in {_short(f) for f in frames}:
            incl_counts[name] += n
    if not total:
        return ["  (no samples)"]
    out = [f"  {total} samples; self (leaf) time:"]
    out += [f"    {c / total:6.1%}  {name}" for name, c in self_counts.most_common(top)]
    out += ["  inclusive time:"]
    out += [f"    {c / total:6.1%}  {name}" for name, c in incl_counts.most_common(top * 2)]
    return out


def _short(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)", the package kept for site-packages
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif "/work/main/" in path:
        path = path.split("/work/main/", 1)[1]
    else:
        path = path.rsplit("/", 2)[-1] if "/" in path else path
    return f"{name} ({path})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=["batched", "batched-grpc", "batched-echo", "unbatched", "stream", "mux",
                                             "busy-stream", "busy-unary"])
    parser.add_argument("--tree", type=Path, default=None, help="run Modelplex from this checkout (as run.py --tree)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-spy", action="store_true", help="CPU shares only (no sampling overhead)")
    parser.add_argument("--offload", action="store_true",
                        help="experiment: the batched MLP runs its forward pass in a worker thread (BENCH_OFFLOAD=1)")
    parser.add_argument("--gc", action="store_true",
                        help="also the garbage collector's collections and CPU time in the router and the replicas "
                             "(experiment_site/sitecustomize.py's BENCH_GC_LOG)")
    parser.add_argument("--uvloop", action="store_true",
                        help="experiment: run the router and replicas on uvloop (experiment_site/sitecustomize.py "
                             "sets the event loop policy; Modelplex's code is unchanged)")
    args = parser.parse_args()
    if args.tree is not None:
        run.product_root = args.tree.resolve()

    spy = str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory(prefix="modelplex-profile-") as tmp:
        workdir = Path(tmp)
        env = {}
        grpc_port = free_port()
        if args.workload in ("batched", "batched-grpc", "batched-echo", "unbatched"):
            cls = {"batched": "BatchedMLP", "batched-grpc": "BatchedMLP", "batched-echo": "BatchedEcho",
                   "unbatched": "MLP"}[args.workload]
            spec = {"replicas": 1, "handler": f"mp_handlers:{cls}", "maxOngoingRequests": 128,
                    "router": {"grpcPort": grpc_port}}
            concurrency = args.concurrency or 32
        elif args.workload.startswith("busy-"):
            cls = "BusyStreamer" if args.workload == "busy-stream" else "BusyMLP"
            spec = {"replicas": 1, "handler": f"mp_handlers:{cls}", "maxOngoingRequests": 32}
            concurrency = args.concurrency or 8
        elif args.workload == "stream":
            spec = {"replicas": 2, "handler": "mp_handlers:Streamer", "maxOngoingRequests": 256}
            env = {"BENCH_STREAM_INTERVAL_S": "0.01"}
            concurrency = args.concurrency or 256
        else:
            spec = {"replicas": 2, "handler": "mp_handlers:Multiplexed", "maxOngoingRequests": 16}
            env = {"BENCH_FETCH_S": "0.1"}
            concurrency = args.concurrency or 16
        if args.offload:
            env["BENCH_OFFLOAD"] = "1"
        if args.uvloop:
            env["BENCH_UVLOOP"] = "1"
        gc_log = workdir / "gc"
        if args.gc:
            gc_log.mkdir()
            env["BENCH_GC_LOG"] = str(gc_log)
        full_env = bench_env(env)
        if args.uvloop or args.gc:
            full_env["PYTHONPATH"] = os.pathsep.join([str(HERE / "experiment_site"), full_env["PYTHONPATH"]])
        with ModelplexStack(workdir, "profile", spec, full_env) as stack:
            pids = {pid: role for pid, role in stack.pids().items() if role in ("router", "replica")}
            if args.uvloop:
                with_uvloop = sum("uvloop" in Path(f"/proc/{pid}/maps").read_text() for pid in pids)
                print(f"uvloop loaded in {with_uvloop} of {len(pids)} server processes", file=sys.stderr)
            names, seen = {}, Counter()
            for pid, role in sorted(pids.items()):
                seen[role] += 1
                names[pid] = f"{role}-{seen[role]}" if role == "replica" else role

            async def load() -> loadgen.Point:
                if args.workload == "busy-stream":
                    return await loadgen.streams(stack.url, mlp_body(MLP_SIZES[0]), BUSY_CHUNKS, concurrency,
                                                 args.seconds, warmup_s=0)
                if args.workload == "batched-grpc":
                    return await loadgen.unary_grpc(f"127.0.0.1:{grpc_port}", "mlp", mlp_body(MLP_SIZES[0])["inputs"],
                                                    concurrency, args.seconds, warmup_s=0)
                if args.workload in ("batched", "batched-echo", "unbatched", "busy-unary"):
                    return await loadgen.unary(stack.url, mlp_body(MLP_SIZES[0]), concurrency, args.seconds,
                                               warmup_s=0)
                if args.workload == "stream":
                    return await loadgen.streams(stack.url, {"chunks": STREAM_CHUNKS}, STREAM_CHUNKS, concurrency,
                                                 args.seconds, warmup_s=0)
                trace = belady.zipf_trace(100_000, 40, 1.1, seed=0)
                return await loadgen.trace(stack.url, trace, {"inputs": mlp_body(MUX_SIZES[0])["inputs"]},
                                           concurrency, max_seconds=args.seconds)

            # Warm up, then measure with the samplers on.
            if args.workload != "mux":
                asyncio.run(_warm(stack.url, args.workload, concurrency))
            spies = []
            if not args.no_spy:
                for pid, name in names.items():
                    out = workdir / f"{name}.raw"
                    spies.append((name, out, subprocess.Popen(
                        [spy, "record", "--pid", str(pid), "--duration", str(int(args.seconds)), "--rate", str(args.rate),
                         "--nonblocking", "--format", "raw", "--output", str(out)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            replica_urls = [r["url"] for r in stack.replicas_table()]
            batches_before = asyncio.run(_batch_stats(replica_urls))
            before = {pid: cpu_seconds(pid) for pid in names}
            threads_before = {pid: thread_cpu_seconds(pid) for pid in names}
            gc_before = {pid: gc_totals(gc_log, pid) for pid in names}
            me_before = time.process_time()
            wall = time.perf_counter()
            point = asyncio.run(load())
            wall = time.perf_counter() - wall
            cpu = {names[pid]: (cpu_seconds(pid) - before[pid]) / wall for pid in names}
            busiest = {names[pid]: max((t - threads_before[pid].get(tid, 0.0) for tid, t in thread_cpu_seconds(pid).items()),
                                       default=0.0) / wall for pid in names}
            cpu["load generator (this process)"] = (time.process_time() - me_before) / wall
            time.sleep(0.6 if args.gc else 0)  # the processes' next write of their totals
            collected = {names[pid]: [(after[0] - before[0], after[1] - before[1]) for before, after in
                                      zip(gc_before[pid], gc_totals(gc_log, pid))] for pid in names}
            batches_after = asyncio.run(_batch_stats(replica_urls))
            for name, out, proc in spies:
                _, err = proc.communicate(timeout=args.seconds + 60)
                if proc.returncode != 0:
                    print(f"py-spy on {name} failed: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
        s = point.summary()
        print(f"\n{args.workload}, concurrency {concurrency}, {wall:.1f} s: {s['rps']:.1f} req/s, p50 {s['p50_ms']:.1f} ms, "
              f"p99 {s['p99_ms']:.1f} ms, errors {s['errors']}"
              + (f", ttfc p99 {s['ttfc_p99_ms']:.1f} ms" if "ttfc_p99_ms" in s else ""))
        count = batches_after[1] - batches_before[1]
        if count:
            waited_ms = (batches_after[2] - batches_before[2]) / count * 1000
            print(f"batches: {count:.0f}, mean size {(batches_after[0] - batches_before[0]) / count:.1f}, "
                  f"a batch's first request waited {waited_ms:.2f} ms on average")
        print(f"load average {os.getloadavg()[0]:.2f}; CPU per process (cores, of {os.cpu_count()}):")
        for name, share in cpu.items():
            per_request = share / s["rps"] * 1e6 if s["rps"] else float("nan")
            thread = f", its busiest thread {busiest[name]:.2f}" if name in busiest else ""
            print(f"  {name:32s} {share:5.2f}  ({per_request:6.0f} us CPU per request{thread})")
        if args.gc:
            print("garbage collector, per second of load (collections x CPU ms, by generation):")
            for name, generations in collected.items():
                per_s = [(count / wall, seconds / wall * 1e3) for count, seconds in generations]
                per_request = sum(seconds for _, seconds in generations) / (s["rps"] * wall) * 1e6 if s["rps"] else 0.0
                print(f"  {name:32s} " + "  ".join(f"gen{g} {n:5.1f} x {ms:6.2f}" for g, (n, ms) in enumerate(per_s))
                      + f"  ({per_request:.1f} us CPU per request)")
        for name, out, _ in spies:
            if out.exists():
                print(f"\n{name}:")
                print("\n".join(summarize(out, args.top)))
    return 0


async def _batch_stats(urls: list[str]) -> tuple[float, float, float]:
    """(sum, count) of ``modelplex_batch_size`` and the sum of ``modelplex_batch_wait_seconds``
    over the replicas."""
    import aiohttp

    total = count = waited = 0.0
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.get(url + "/metrics") as resp:
                for line in (await resp.text()).splitlines():
                    if line.startswith("modelplex_batch_size_sum"):
                        total += float(line.rsplit(" ", 1)[1])
                    elif line.startswith("modelplex_batch_size_count"):
                        count += float(line.rsplit(" ", 1)[1])
                    elif line.startswith("modelplex_batch_wait_seconds_sum"):
                        waited += float(line.rsplit(" ", 1)[1])
    return total, count, waited


async def _warm(url: str, workload: str, concurrency: int) -> None:
    if workload == "busy-stream":
        await loadgen.streams(url, mlp_body(MLP_SIZES[0]), BUSY_CHUNKS, concurrency, 2.0, warmup_s=0)
    elif workload == "stream":
        await loadgen.streams(url, {"chunks": STREAM_CHUNKS}, STREAM_CHUNKS, concurrency, 1.0, warmup_s=0)
    else:
        await loadgen.unary(url, mlp_body(MLP_SIZES[0]), concurrency, 1.0, warmup_s=0)


if __name__ == "__main__":
    sys.exit(main())
