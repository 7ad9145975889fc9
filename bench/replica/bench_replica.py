"""Replica-only benchmark: one replica, the built-in TorchScript handler, a small MLP.

Closed-loop clients at concurrency 1 / 8 / 32 send single-row requests straight to the
replica's /v1/invoke, once with batching off (maxBatchSize 1) and once on. Prints a
markdown table (throughput, p50, p99) and the in-process compute bound beside it.

    .venv/bin/python bench/replica/bench_replica.py [--seconds 8] [--concurrency 1 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import aiohttp
import torch

from modelplex.processes import free_port, spawn, stop, wait_for_async

warnings.filterwarnings("ignore", category=FutureWarning)  # TorchScript's deprecation notice

SIZES = (512, 2048, 2048, 512)
MAX_REQUESTS_PER_POINT = 200_000  # bounds every load loop in count as well as time


def build_model(path: Path) -> None:
    torch.manual_seed(0)
    layers = []
    for a, b in zip(SIZES, SIZES[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    torch.jit.save(torch.jit.script(torch.nn.Sequential(*layers[:-1]).eval()), str(path))


def compute_bound(path: Path, batch_sizes: list[int], seconds: float = 1.0) -> dict[int, float]:
    """Rows per second of the bare forward pass at each batch size, one intra-op thread."""
    torch.set_num_threads(1)
    model = torch.jit.load(str(path))
    rates = {}
    with torch.inference_mode():
        for size in batch_sizes:
            x = torch.randn(size, SIZES[0])
            model(x)
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                model(x)
                count += 1
            rates[size] = count * size / (time.perf_counter() - started)
    return rates


def write_manifest(folder: Path, batch_size: int, wait_ms: float, max_ongoing: int) -> Path:
    path = folder / f"bench-b{batch_size}.yaml"
    path.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "bench"},
        "spec": {
            "image": "local", "modelSource": {"uri": "file:{model_id}.pt"},
            "batching": {"maxBatchSize": batch_size, "batchWaitTimeoutMs": wait_ms},
            "maxOngoingRequests": max_ongoing, "multiplexing": {"prewarm": ["mlp"]},
        },
    }))
    return path


async def wait_ready(url: str, timeout: float = 120) -> None:
    async with aiohttp.ClientSession() as session:
        async def ready() -> bool:
            async with session.get(url + "/readyz") as response:
                return response.status == 200

        await wait_for_async(ready, timeout, 0.2, f"replica at {url} ready", retry_on=(aiohttp.ClientError,))


async def closed_loop(url: str, concurrency: int, seconds: float) -> dict:
    body = json.dumps({"inputs": [0.01] * SIZES[0]}).encode()
    headers = {"serve_multiplexed_model_id": "mlp", "Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one_client(deadline: float) -> None:
            nonlocal errors
            while time.perf_counter() < deadline and len(latencies) < MAX_REQUESTS_PER_POINT:
                started = time.perf_counter()
                async with session.post(url + "/v1/invoke", data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                        continue
                latencies.append(time.perf_counter() - started)

        # Warm up, then measure.
        await asyncio.gather(*(one_client(time.perf_counter() + 1.0) for _ in range(concurrency)))
        latencies.clear()
        started = time.perf_counter()
        await asyncio.gather(*(one_client(started + seconds) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")
    return {"rps": len(latencies) / elapsed, "p50_ms": pick(0.50), "p99_ms": pick(0.99), "errors": errors,
            "requests": len(latencies)}


def start_replica(manifest: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOG_LEVEL": "warning"}
    log.write_bytes(b"")
    return spawn([sys.executable, "-m", "modelplex_launcher.cli", "replica", "--spec", str(manifest), "--port", str(port)],
                 log=log, env=env)


async def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="modelplex-bench-") as tmp:
        folder = Path(tmp)
        build_model(folder / "mlp.pt")
        bound = compute_bound(folder / "mlp.pt", [1, 8, 32])
        print("compute bound (rows/s, 1 thread): " + ", ".join(f"batch {b}: {r:,.0f}" for b, r in bound.items()),
              file=sys.stderr)
        rows = []
        for label, batch_size in (("unbatched", 1), ("batched", 32)):
            manifest = write_manifest(folder, batch_size, args.wait_ms, max_ongoing=max(64, max(args.concurrency) * 2))
            port = free_port()
            process = start_replica(manifest, port, folder / f"{label}.log")
            try:
                await wait_ready(f"http://127.0.0.1:{port}")
                for concurrency in args.concurrency:
                    print(f"==> {label}, concurrency {concurrency}, {args.seconds:g} s", file=sys.stderr)
                    result = await closed_loop(f"http://127.0.0.1:{port}", concurrency, args.seconds)
                    rows.append((label, concurrency, result))
            finally:
                stop(process, grace=20)
        print("\n| mode | concurrency | req/s | p50 ms | p99 ms | errors | share of compute bound |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, concurrency, r in rows:
            ceiling = bound[32] if label == "batched" else bound[1]
            print(f"| {label} | {concurrency} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                  f"{r['errors']} | {r['rps'] / ceiling:.0%} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--wait-ms", type=float, default=2.0, help="batchWaitTimeoutMs when batched")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
