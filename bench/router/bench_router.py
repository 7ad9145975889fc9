"""Router benchmark: a Zipf(1.1) trace over 40 models on 2 replicas x 4 model slots, routed
cache-aware (the router's policy) and at random (the baseline), plus the router's own overhead.

    .venv/bin/python bench/router/bench_router.py [--requests 2000] [--concurrency 16]

Each policy gets fresh replicas (empty caches) and the same trace. Real processes on
loopback; a model load costs ``--load-s`` and an inference ``--infer-s`` of waiting (as on a
GPU), so the numbers show routing, not this machine's CPU. Bounded by ``--requests`` and
``--max-seconds``. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from modelplex.processes import free_port, signal_group, spawn, stop, wait_for_async

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "compare"))
import belady  # noqa: E402  (the trace, shared with the cache simulation)

MODEL_ID_HEADER = "serve_multiplexed_model_id"


def write_manifest(folder: Path, replicas: int, slots: int, max_ongoing: int) -> Path:
    shutil.copy(HERE / "handler.py", folder / "bench_handler.py")
    manifest = {
        "apiVersion": "modelplex.io/v1alpha1",
        "kind": "MultiplexedDeployment",
        "metadata": {"name": "bench"},
        "spec": {"replicas": replicas, "image": "local", "handler": "bench_handler:BenchModel",
                 "multiplexing": {"maxModelsPerReplica": slots}, "maxOngoingRequests": max_ongoing},
    }
    path = folder / "bench.yaml"
    path.write_text(json.dumps(manifest))
    return path


class Stack:
    """Replicas and a router as processes; stopped (process groups) on exit, whatever happens."""

    def __init__(self, manifest: Path, replicas: int, policy: str, env: dict):
        self.manifest, self.replicas, self.policy, self.env = manifest, replicas, policy, env
        self.procs: list[subprocess.Popen] = []
        self.replica_urls: list[str] = []
        self.router_url = ""
        self.control_url = ""  # the router's control port: its metrics

    def _start(self, argv: list[str], env: dict, log: Path) -> None:
        log.write_bytes(b"")
        self.procs.append(spawn(argv, log=log, env=env))

    async def _wait_ready(self, timeout: float = 120.0) -> None:
        def started() -> None:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a process exited while starting; logs in {self.manifest.parent}")

        async with aiohttp.ClientSession() as session:
            async def ready() -> bool:
                async with session.get(self.router_url + "/readyz") as resp:
                    return resp.status == 200 and (await resp.json())["ready_replicas"] == self.replicas

            await wait_for_async(ready, timeout, 0.1, "the stack ready", retry_on=(aiohttp.ClientError,), guard=started)

    def __enter__(self) -> Stack:
        cli = [sys.executable, "-m", "modelplex_launcher.cli", "--log-level", "warning"]
        folder = self.manifest.parent
        try:
            for i in range(self.replicas):
                port = free_port()
                self.replica_urls.append(f"http://127.0.0.1:{port}")
                self._start([*cli, "replica", "--spec", str(self.manifest), "--port", str(port)],
                            self.env, folder / f"{self.policy}-replica-{i}.log")
            port = free_port()
            self.router_url = f"http://127.0.0.1:{port}"
            control_port = free_port()
            self.control_url = f"http://127.0.0.1:{control_port}"
            argv = [*cli, "router", "--spec", str(self.manifest), "--port", str(port), "--control-port", str(control_port)]
            for i, url in enumerate(self.replica_urls):
                argv += ["--replica", f"r{i}={url}"]
            self._start(argv, {**self.env, "MODELPLEX_ROUTING_POLICY": self.policy},
                        folder / f"{self.policy}-router.log")
            asyncio.run(self._wait_ready())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            signal_group(proc.pid, signal.SIGTERM)  # all at once, then each within its grace
        for proc in self.procs:
            stop(proc, grace=10)


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


@dataclass
class Result:
    policy: str
    sent: int
    ok: int
    seconds: float
    latencies: list[float]
    loads: float
    evictions: float
    router_hits: float
    router_misses: float
    router_fallbacks: float

    def row(self) -> list[str]:
        lat = sorted(self.latencies)
        p50 = lat[len(lat) // 2] * 1000 if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
        hit_rate = 1 - self.loads / self.sent if self.sent else float("nan")
        routed = self.router_hits + self.router_misses
        return [self.policy, f"{self.ok}/{self.sent}", f"{hit_rate:.1%}",
                f"{self.router_hits / routed:.1%}" if routed else "-", f"{self.loads:.0f}",
                f"{self.evictions:.0f}", f"{self.router_fallbacks:.0f}", f"{p50:.1f}", f"{p99:.1f}",
                f"{self.ok / self.seconds:.0f}"]


async def run_trace(stack: Stack, trace: list[str], concurrency: int, max_seconds: float) -> Result:
    latencies: list[float] = []
    ok = sent = 0
    next_index = 0
    deadline = time.monotonic() + max_seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def client() -> None:
            nonlocal ok, sent, next_index
            while next_index < len(trace) and time.monotonic() < deadline:
                model = trace[next_index]
                next_index += 1
                sent += 1
                started = time.perf_counter()
                try:
                    async with session.post(stack.router_url + "/", json={"x": [1, 2, 3]},
                                            headers={MODEL_ID_HEADER: model}) as resp:
                        await resp.read()
                        if resp.status == 200:
                            ok += 1
                            latencies.append(time.perf_counter() - started)
                except aiohttp.ClientError:
                    pass

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
        loads = sum([await metric(session, url, "modelplex_model_loads_total") for url in stack.replica_urls])
        evictions = sum([await metric(session, url, "modelplex_model_evictions_total") for url in stack.replica_urls])
        hits = await metric(session, stack.control_url, "modelplex_router_cache_hits_total")
        misses = await metric(session, stack.control_url, "modelplex_router_cache_misses_total")
        fallbacks = await metric(session, stack.control_url, "modelplex_router_fallbacks_total")
    return Result(stack.policy, sent, ok, seconds, latencies, loads, evictions, hits, misses, fallbacks)


async def overhead(stack: Stack, n: int) -> dict[str, float]:
    """p50/p99 at concurrency 1 on a loaded model: straight to a replica and through the router,
    interleaved request by request so that both see the same background load."""
    async with aiohttp.ClientSession() as session:
        # Put the model on a replica through the router, then time both paths to that replica.
        async with session.post(stack.router_url + "/", json={}, headers={MODEL_ID_HEADER: "warm"}) as resp:
            replica = resp.headers["X-Modelplex-Replica"]
            await resp.read()
        paths = {"direct": stack.replica_urls[int(replica[1:])] + "/v1/invoke", "router": stack.router_url + "/"}
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(n):
            for name, url in paths.items():
                started = time.perf_counter()
                async with session.post(url, json={"x": 1}, headers={MODEL_ID_HEADER: "warm"}) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                times[name].append(time.perf_counter() - started)
    out = {}
    diffs = sorted(r - d for r, d in zip(times["router"], times["direct"]))
    for name, values in (*times.items(), ("diff", diffs)):
        values = sorted(values)
        out[name + "_p50"] = values[n // 2] * 1000
        out[name + "_p99"] = values[min(n - 1, int(n * 0.99))] * 1000
    return out


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    belady.add_trace_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4, help="models per replica")
    parser.add_argument("--max-ongoing", type=int, default=16)
    parser.add_argument("--load-s", type=float, default=0.1, help="seconds a model load takes")
    parser.add_argument("--infer-s", type=float, default=0.002, help="seconds an inference takes")
    parser.add_argument("--max-seconds", type=float, default=180.0, help="per policy")
    parser.add_argument("--overhead-requests", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    trace = belady.zipf_trace(args.requests, args.models, args.zipf, args.seed)
    env = {**os.environ, "BENCH_LOAD_S": str(args.load_s), "BENCH_INFER_S": str(args.infer_s)}
    results: list[Result] = []
    over: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="modelplex-bench-") as tmp:
        manifest = write_manifest(Path(tmp), args.replicas, args.slots, args.max_ongoing)
        for policy in ("cache-aware", "random"):
            print(f"running {len(trace)} requests, policy {policy} ...", file=sys.stderr, flush=True)
            with Stack(manifest, args.replicas, policy, env) as stack:
                results.append(asyncio.run(run_trace(stack, trace, args.concurrency, args.max_seconds)))
                if policy == "cache-aware" and args.overhead_requests:
                    over = asyncio.run(overhead(stack, args.overhead_requests))

    distinct = len(set(trace))
    print(f"\nZipf({args.zipf}) over {args.models} models ({distinct} in the trace), {len(trace)} requests, "
          f"concurrency {args.concurrency}, {args.replicas} replicas x {args.slots} slots, "
          f"load {args.load_s * 1000:.0f} ms, inference {args.infer_s * 1000:.0f} ms\n")
    print(table(["policy", "ok/sent", "hit rate (1 - loads/requests)", "router hit counter", "loads",
                 "evictions", "hot spreads", "p50 ms", "p99 ms", "req/s"], [r.row() for r in results]))
    if over:
        print(f"\nRouter overhead, concurrency 1, model loaded ({args.overhead_requests} requests each, "
              "interleaved)\n")
        print(table(["path", "p50 ms", "p99 ms"], [
            ["straight to the replica", f"{over['direct_p50']:.3f}", f"{over['direct_p99']:.3f}"],
            ["through the router", f"{over['router_p50']:.3f}", f"{over['router_p99']:.3f}"],
            ["router overhead (paired difference)", f"{over['diff_p50']:.3f}", f"{over['diff_p99']:.3f}"],
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
