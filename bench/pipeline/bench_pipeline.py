"""Pipeline benchmark: the example video pipeline (examples/pipeline), naive vs streaming.

    .venv/bin/python bench/pipeline/bench_pipeline.py [--chunks 32] [--runs 3] [--side 128]

Starts ``modelplex local examples/pipeline/pipeline.yaml`` (five deployments: the two
orchestrators, decode, detect x2, encode) on free ports, sends the same synthetic video to
each orchestrator ``--runs`` times, one request at a time, and prints a markdown table:
time to first output (the first encoded chunk a client can use: for the naive orchestrator
that is its whole answer), total time, and the peak memory of the whole stack (the sum of
the RSS of every replica and router, sampled from /proc every 10 ms) above its idle level.

Beside them, the bounds the stage costs give: stage after stage, the video passes each
stage in turn (chunks x cost, per stage); pipelined, the first chunk passes every stage
(the fill time) and each further chunk adds the slowest stage's cost over its replicas.
Stage costs are simulated accelerator time (``--decode-s`` etc., per chunk of 8 frames)
plus a little real torch work, so the numbers show the pipelining, not this machine's CPU.
Bounded by ``--max-seconds``; every process is stopped on exit, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from modelplex.processes import consecutive_free_ports, descendants, running, spawn, stop, wait_for
from modelplex.wire.ready import READY_FILE_OPTION, read_ready_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pipeline"
MODEL_ID_HEADER = "serve_multiplexed_model_id"
CHUNK_FRAMES = 8


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class PeakMemory:
    """Samples the summed RSS of ``pids`` every 10 ms in a thread; :attr:`peak` is the highest."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pids))
            self._stop.wait(0.01)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class LocalStack:
    """``modelplex local`` on the example's manifests; stopped (its process group) on exit."""

    def __init__(self, folder: Path, env: dict, timeout_s: float = 180.0):
        self.folder, self.env, self.timeout_s = folder, env, timeout_s
        self.proc: subprocess.Popen | None = None
        self.log = folder / "local.log"
        self.urls: dict[str, str] = {}

    def __enter__(self) -> LocalStack:
        manifest = self.folder / "pipeline.yaml"
        deployments = sum(1 for doc in yaml.safe_load_all(manifest.read_text()) if doc)
        port = consecutive_free_ports(deployments)
        self.log.write_bytes(b"")
        ready_file = self.folder / "local.ready.json"
        ready_file.unlink(missing_ok=True)
        self.proc = spawn([sys.executable, "-m", "modelplex_launcher.cli", "--log-level", "warning", "local", str(manifest),
                           "--port", str(port), READY_FILE_OPTION, str(ready_file)], log=self.log, env=self.env)
        try:
            ready = wait_for(lambda: read_ready_file(ready_file), self.timeout_s, 0.2,
                             f"modelplex local ready (see {self.log})",
                             guard=lambda: running(self.proc, "modelplex local", self.log))
            self.urls = ready.urls
            return self
        except BaseException:
            self.__exit__()
            raise

    def pids(self) -> list[int]:
        return descendants(self.proc.pid) if self.proc else []

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        # SIGTERM to local mode stops its children (each in a group of its own) in order.
        stop(self.proc, grace=30)


@dataclass
class Run:
    first_output_s: float
    total_s: float
    stack_peak: int  # bytes above idle, all replicas and routers together
    orchestrator_peak: int  # bytes above idle, the orchestrator's replica alone
    chunks: int


@dataclass
class Mode:
    name: str  # the orchestrator's deployment: "naive" or "streaming"
    label: str
    runs: list[Run] = field(default_factory=list)


async def one_video(session: aiohttp.ClientSession, url: str, body: dict, streaming: bool) -> tuple[float, float, int]:
    """(time to the first usable output, total time, chunks received) for one request."""
    started = time.perf_counter()
    first = None
    chunks = 0
    async with session.post(url + "/", json=body, headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {(await response.text())[:300]}")
        if streaming:
            async for data in response.content.iter_any():
                chunks += data.count(b"\n")
                if first is None and chunks:
                    first = time.perf_counter() - started  # a whole encoded chunk has arrived
        else:
            chunks = len((await response.json())["chunks"])
            first = time.perf_counter() - started
    return first, time.perf_counter() - started, chunks


def orchestrator_pid(pids: list[int], deployment: str) -> int:
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"replica" in argv and deployment.encode() in argv:
            return pid
    raise RuntimeError(f"no replica process of {deployment!r} found")


async def measure(mode: Mode, stack: LocalStack, args: argparse.Namespace, deadline: float) -> None:
    """``args.runs`` videos through one orchestrator, one at a time, on a stack of its own.

    A stack of its own, because memory a process once used mostly stays in its RSS (the
    allocator keeps it): measured on one stack, the second mode would inherit the first's.
    """
    body = {"frames": args.chunks * CHUNK_FRAMES, "chunk_frames": CHUNK_FRAMES, "height": args.side,
            "width": args.side, "seed": 1}
    streaming = mode.name == "streaming"
    url = stack.urls[mode.name]
    timeout = aiohttp.ClientTimeout(total=max(30.0, args.max_seconds))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # Warm up (connections, the first model load, imports) before measuring.
        await one_video(session, url, {**body, "frames": CHUNK_FRAMES * 2}, streaming)
        pids = stack.pids()
        orchestrator = [orchestrator_pid(pids, mode.name)]
        idle, idle_orchestrator = rss_bytes(pids), rss_bytes(orchestrator)
        for _ in range(args.runs):
            if time.monotonic() > deadline:
                print(f"stopping early: --max-seconds {args.max_seconds:g} reached", file=sys.stderr)
                return
            with PeakMemory(pids) as whole, PeakMemory(orchestrator) as alone:
                first, total, chunks = await one_video(session, url, body, streaming)
            mode.runs.append(Run(first, total, max(0, whole.peak - idle), max(0, alone.peak - idle_orchestrator),
                                 chunks))


def bounds(args: argparse.Namespace, manifest: Path) -> tuple[float, float, float]:
    """(fill time, stage after stage, pipelined) from the stage costs and replica counts."""
    replicas = {doc["metadata"]["name"]: doc["spec"].get("replicas", 1)
                for doc in yaml.safe_load_all(manifest.read_text()) if doc}
    costs = {"decode": args.decode_s, "detect": args.detect_s, "encode": args.encode_s}
    fill = sum(costs.values())
    # Decode is one stream, so one decoder however many replicas; the others spread chunks.
    rate_limited = [costs["decode"]] + [costs[s] / max(1, replicas.get(s, 1)) for s in ("detect", "encode")]
    return fill, args.chunks * fill, fill + (args.chunks - 1) * max(rate_limited)


def table(modes: list[Mode], args: argparse.Namespace, manifest: Path) -> str:
    fill, naive_bound, pipelined_bound = bounds(args, manifest)
    rows = ["| orchestrator | runs | first output (s) | total (s) | bound (s) | peak memory above idle, "
            "whole stack (MB) | of which the orchestrator (MB) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for mode, bound in zip(modes, (naive_bound, pipelined_bound)):
        if not mode.runs:
            continue
        runs = mode.runs
        rows.append(f"| {mode.label} | {len(runs)} | {statistics.median(r.first_output_s for r in runs):.2f} | "
                    f"{statistics.median(r.total_s for r in runs):.2f} | {bound:.2f} | "
                    f"{max(r.stack_peak for r in runs) / 2**20:.0f} | "
                    f"{max(r.orchestrator_peak for r in runs) / 2**20:.0f} |")
    chunk_mb = CHUNK_FRAMES * 3 * args.side * args.side / 2**20
    rows += ["", f"{args.chunks} chunks of {CHUNK_FRAMES} frames of 3x{args.side}x{args.side} "
                 f"({chunk_mb:.2f} MB a chunk, {chunk_mb * args.chunks:.0f} MB in all); per chunk: decode "
                 f"{args.decode_s:g} s, detect {args.detect_s:g} s (2 replicas), encode {args.encode_s:g} s; "
                 f"window {args.window}. Times are medians, memory the highest of the runs. Bounds: stage "
                 f"after stage = chunks x (sum of the stage costs); pipelined = fill time ({fill:.2f} s) + "
                 f"(chunks - 1) x the slowest stage's cost per replica."]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=32, help="chunks of 8 frames in the video")
    parser.add_argument("--side", type=int, default=128, help="frame height and width, pixels")
    parser.add_argument("--runs", type=int, default=3, help="videos per orchestrator")
    parser.add_argument("--decode-s", type=float, default=0.02, help="decode cost per chunk, seconds")
    parser.add_argument("--detect-s", type=float, default=0.12, help="detect cost per chunk, seconds")
    parser.add_argument("--encode-s", type=float, default=0.06, help="encode cost per chunk, seconds")
    parser.add_argument("--window", type=int, default=4, help="chunks in flight in the streaming orchestrator")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop measuring after this long")
    args = parser.parse_args()
    if args.chunks < 1 or args.runs < 1 or not 16 <= args.side <= 1024:
        parser.error("--chunks and --runs must be >= 1, --side in 16..1024")

    env = {**os.environ, "PIPELINE_DECODE_S": str(args.decode_s), "PIPELINE_DETECT_S": str(args.detect_s),
           "PIPELINE_ENCODE_S": str(args.encode_s), "PIPELINE_WINDOW": str(args.window)}
    deadline = time.monotonic() + args.max_seconds
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as scratch:
        folder = Path(scratch)
        for name in ("pipeline.yaml", "frames.py", "stages.py", "orchestrators.py"):
            shutil.copy(EXAMPLE / name, folder / name)
        modes = [Mode("naive", "naive (stage after stage)"), Mode("streaming", "streaming (chunk by chunk)")]
        for mode in modes:
            print(f"{mode.name}: starting modelplex local {EXAMPLE / 'pipeline.yaml'} ...", file=sys.stderr, flush=True)
            try:
                with LocalStack(folder, env) as stack:
                    asyncio.run(measure(mode, stack, args, deadline))
            except RuntimeError as error:
                log = folder / "local.log"
                print(f"bench failed: {error}\n{log.read_text(errors='replace')[-3000:] if log.exists() else ''}",
                      file=sys.stderr)
                return 1
        print(table(modes, args, folder / "pipeline.yaml"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
