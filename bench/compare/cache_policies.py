"""The model cache's options on the multiplexing workload, and the warm tier's reload time.

    .venv/bin/python bench/compare/cache_policies.py [--requests 2000] [--no-ray]

1. Hit rate: ``run.py``'s workload 2 (the same Zipf(1.1) trace of 40 models, 2 replicas x 4
   slots, each load a 100 ms fetch plus real construction, 16 clients) on Modelplex with each
   cache configuration, beside Ray Serve on the same trace. Hit rate = 1 - loads / requests, and
   its share of Belady's offline optimum for 8 slots.
2. Warm reload vs cold: the built-in TorchScript handler, 16 MB models served over HTTP on
   loopback by a store that answers after 100 ms (an object store's latency), one slot, two
   models asked for in turn so that every request reloads: with ``hostCacheBytes: 0`` each
   reload fetches; with ``64Mi`` it reads the CPU warm tier's disk copy.

Writes ``bench/results/cache_policies.txt`` (and prints as it goes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import aiohttp  # noqa: E402
import belady  # noqa: E402
import loadgen  # noqa: E402
import run  # noqa: E402
from aiohttp import web  # noqa: E402
from handlers import MUX_SLOTS  # noqa: E402

CONFIGS = {
    "lru": {},
    "lfu": {"evictionPolicy": "lfu"},
    "lru, 8 loads at once": {"maxConcurrentLoads": 8},
    "lfu, 8 loads at once": {"evictionPolicy": "lfu", "maxConcurrentLoads": 8},
}
STORE_DELAY_S = 0.1
WARM_WIDTH = 2048  # a 2048 x 2048 float32 layer: 16 MB per model file


def hit_rates(settings, lines: list[str], configs: list[str], ray: bool) -> None:
    trace = run.mux_trace(settings)
    slots = run.MUX["replicas"] * MUX_SLOTS
    ceiling = belady.belady_hits(trace, slots) / len(trace)
    head = (f"1. {len(trace)} requests, {len(set(trace))} models, Zipf({run.MUX['zipf']}), {run.MUX['replicas']} "
            f"replicas x {MUX_SLOTS} slots, {settings.mux_concurrency} clients; offline: Belady(8) {ceiling:.3f}, "
            f"LRU(8) {belady.lru_hits(trace, slots) / len(trace):.3f}")
    emit(lines, head)
    emit(lines, f"{'system':28s} {'hit rate':>8s} {'of Belady':>9s} {'loads':>6s} {'loads at once':>13s} "
                f"{'req/s':>7s} {'p50 ms':>7s} {'p99 ms':>7s}")
    with tempfile.TemporaryDirectory(prefix="modelplex-cache-bench-") as tmp:
        systems = [(f"Modelplex {name}", CONFIGS[name]) for name in configs]
        if ray:
            systems.append(("Ray Serve", None))
        for label, cache in systems:
            if cache is None:
                entry = run.mux_ray(settings, Path(tmp), trace, {"ray_start_s": []})
            else:
                entry = run.mux_modelplex(settings, Path(tmp), trace, overhead=False, multiplexing=cache or None)
            emit(lines, f"{label:28s} {entry['hit_rate']:8.3f} {entry['hit_rate'] / ceiling:9.0%} {entry['loads']:6d} "
                        f"{entry['loads_in_flight_mean']:7.2f} (max {entry['loads_in_flight_max']:2d}) "
                        f"{entry['rps']:7.1f} {entry['p50_ms']:7.0f} {entry['p99_ms']:7.0f}"
                        + (f"  errors {entry['errors']}" if entry["errors"] else ""))


class SlowStore:
    """Model files over HTTP on loopback, each answer after ``delay_s``, in a thread of its own."""

    def __init__(self, folder: Path, delay_s: float):
        self.folder, self.delay_s = folder, delay_s
        self.port = run.free_port()
        self.url = f"http://127.0.0.1:{self.port}/models/{{model_id}}.pt"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _start(self) -> None:
        @web.middleware
        async def slow(request, handler):
            await asyncio.sleep(self.delay_s)
            return await handler(request)

        app = web.Application(middlewares=[slow])
        app.router.add_static("/models", self.folder)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self) -> SlowStore:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def write_models(folder: Path) -> None:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(["a", "b"]):
        torch.manual_seed(index)
        model = torch.nn.Sequential(torch.nn.Linear(WARM_WIDTH, WARM_WIDTH), torch.nn.ReLU(), torch.nn.Linear(WARM_WIDTH, 8))
        torch.jit.save(torch.jit.script(model.eval()), str(folder / f"{name}.pt"))


async def alternate(url: str, rounds: int) -> list[float]:
    """Seconds per request, a and b in turn (each one a reload after the first two)."""
    body = {"inputs": [1.0] * WARM_WIDTH}
    seconds = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for i in range(rounds):
            started = time.perf_counter()
            async with session.post(url + "/", json=body, headers={loadgen.MODEL_ID_HEADER: "ab"[i % 2]}) as response:
                assert response.status == 200, await response.text()
                await response.read()
            seconds.append(time.perf_counter() - started)
    return seconds[2:]


def warm_reloads(lines: list[str], rounds: int) -> None:
    emit(lines, f"\n2. reload time, built-in handler, 16 MB TorchScript models, a store answering after "
                f"{STORE_DELAY_S * 1000:.0f} ms, one slot, {rounds - 2} reloads (request latency, ms)")
    with tempfile.TemporaryDirectory(prefix="modelplex-warm-bench-") as tmp:
        folder = Path(tmp) / "store"
        write_models(folder)
        with SlowStore(folder, STORE_DELAY_S) as store:
            for label, host_cache in (("cold (hostCacheBytes 0)", 0), ("warm (hostCacheBytes 64Mi)", "64Mi")):
                spec = {"replicas": 1, "modelSource": {"uri": store.url}, "batching": {"batchWaitTimeoutMs": 1},
                        "multiplexing": {"maxModelsPerReplica": 1, "hostCacheBytes": host_cache}}
                env = run.bench_env({"MODELPLEX_WARM_DIR": str(Path(tmp) / "warm")})
                with run.ModelplexStack(Path(tmp), "warm" if host_cache else "cold", spec, env) as stack:
                    seconds = sorted(asyncio.run(alternate(stack.url, rounds)))
                emit(lines, f"{label:28s} p50 {loadgen.pct(seconds, 0.5):7.1f}  "
                            f"p99 {loadgen.pct(seconds, 0.99):7.1f}  mean {sum(seconds) / len(seconds) * 1000:7.1f}")


def emit(lines: list[str], line: str) -> None:
    print(line, flush=True)
    lines.append(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--no-ray", action="store_true", help="leave Ray Serve out of part 1")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                        help="the Modelplex cache configurations of part 1")
    parser.add_argument("--reloads", type=int, default=40)
    parser.add_argument("--parts", nargs="+", default=["hit-rate", "warm"], choices=["hit-rate", "warm"])
    parser.add_argument("--out", type=Path, default=run.ROOT / "bench" / "results" / "cache_policies.txt")
    args = parser.parse_args()
    settings = run.settings_for(argparse.Namespace(quick=False, seconds=6.0, rounds=1))
    settings.mux_requests = args.requests
    device = "a GPU" if _has_cuda() else "no GPU"
    lines = [f"{time.strftime('%Y-%m-%d %H:%M')}: {os.cpu_count()} CPUs, {device}, "
             f"load average {os.getloadavg()[0]:.2f} at the start"]
    print(lines[0])
    if "hit-rate" in args.parts:
        hit_rates(settings, lines, args.configs, ray=not args.no_ray)
    if "warm" in args.parts:
        warm_reloads(lines, args.reloads + 2)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
