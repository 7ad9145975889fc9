"""What a swap costs, on CPU: the neighbours of loads, and loads against the speed of their bytes.

    .venv/bin/python bench/swap/run.py neighbours [--before /tmp/swap-before] [--rounds 3] [--seconds 8]
    .venv/bin/python bench/swap/run.py speed [--before /tmp/swap-before] [--rounds 5] [--only 256MB-torchscript-http]

``neighbours``: one replica, ``maxModelsPerReplica: 2`` (the steady model and one other, so every
load evicts), torch on one intra-op thread (``OMP_NUM_THREADS=1``), a steady model whose forward
takes a few ms served by 2 closed-loop clients, while other models of ~50 MB load through the
replica's load endpoint (``POST /v1/models/{id}/load``) at ``--loads-per-s``. Each variant's
replica runs a phase without loads and one with them (in alternating order), and the variants
take turns each round: ``before`` (the replica from ``--before``, a git worktree of the commit
before, TorchScript), ``torchscript`` and ``safetensors`` (this checkout). Medians over rounds.

``speed``: one replica per format, size and variant (``before`` from ``--before``, this
checkout); each load (``POST .../load``, client wall time, so an HTTP round trip is in it, and
the replica process's CPU time) beside a plain read of the same bytes in the same run (the file
from page cache, or an HTTP download from the same loopback store), interleaved, medians; the
ratio is the median of each load over the plain read right before it.

Numbers taken on a shared machine are noisy: compare variants from the same run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import torch
from safetensors.torch import save_file

from modelplex.processes import free_port, spawn, stop, wait_for_async
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.oip import HEADER_LENGTH, PROTOCOL, PROTOCOL_HEADER

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from nets import Block  # noqa: E402 - the benchmark's own model class, beside this file

warnings.filterwarnings("ignore", category=FutureWarning)  # TorchScript's deprecation notice

#: The package roots of a checkout (pyproject's ``where``): a ``--before`` worktree's code is
#: put first on the replica's path, ahead of this checkout's installed one.
ROOTS = (".", "replica", "router", "operator", "cluster", "launcher")
EXTENSIONS = {"torchscript": "pt", "safetensors": "safetensors"}
STEADY = "steady"
SWAP_MODELS = 6
#: The swapped models' shape (and the steady one's): 12 x 1024^2 weights, 50.4 MB.
SWAP_KWARGS = {"width": 1024, "depth": 12, "out": 8}
#: speed: 256 MiB and 1 MiB models.
SIZES = {"256MB": {"width": 4096, "depth": 4, "out": 8}, "1MB": {"width": 512, "depth": 1, "out": 8}}
MAX_REQUESTS = 200_000  # every load loop is bounded in count as well as time


# -- models, manifests, processes -------------------------------------------------------------

def save_models(folder: Path, fmt: str, names: list[str], kwargs: dict, seed: int = 0) -> int:
    """Distinct files (own inodes, own page-cache pages) of one ``Block(**kwargs)``; their size."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    module = Block(**kwargs).eval()
    first = folder / f"{names[0]}.{EXTENSIONS[fmt]}"
    if fmt == "torchscript":
        torch.jit.save(torch.jit.script(module), str(first))
    else:
        save_file(module.state_dict(), str(first))
    for name in names[1:]:
        shutil.copyfile(first, folder / f"{name}.{EXTENSIONS[fmt]}")
    return first.stat().st_size


def write_manifest(folder: Path, name: str, uri: str, fmt: str, kwargs: dict, max_models: int) -> Path:
    shutil.copy(HERE / "nets.py", folder / "nets.py")
    source: dict[str, Any] = {"uri": uri}
    if fmt == "safetensors":
        source.update(format="safetensors", module="nets:Block", kwargs=kwargs)
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": name},
        "spec": {"image": "local", "modelSource": source, "batching": {"maxBatchSize": 1},
                 "maxOngoingRequests": 64, "multiplexing": {"maxModelsPerReplica": max_models}},
    }))
    return path


def start_replica(manifest: Path, port: int, log: Path, code_root: Path | None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LOG_LEVEL": "warning"}
    if code_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(code_root / root) for root in ROOTS)
    return spawn([sys.executable, "-m", "modelplex_launcher.cli", "replica", "--spec", str(manifest),
                  "--host", "127.0.0.1", "--port", str(port)], log=log, env=env, cwd=manifest.parent)


async def wait_ready(session: aiohttp.ClientSession, url: str, process: subprocess.Popen, log: Path) -> None:
    async def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the replica exited: {log.read_text()[-2000:]}")
        async with session.get(url + "/readyz") as response:
            return response.status == 200

    await wait_for_async(ready, 120, 0.2, f"replica at {url} ready", retry_on=(aiohttp.ClientError,))


def oip_body(rows: int, width: int) -> tuple[bytes, dict[str, str]]:
    """An OIP request with its tensor in binary (cheap to read on both sides)."""
    tensor = torch.full((rows, width), 0.01).numpy().tobytes()
    header = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [rows, width],
                                     "parameters": {"binary_data_size": len(tensor)}}]}).encode()
    return header + tensor, {HEADER_LENGTH: str(len(header)), PROTOCOL_HEADER: PROTOCOL,
                             "Content-Type": "application/octet-stream"}


async def infer(session: aiohttp.ClientSession, url: str, model_id: str, body: bytes, headers: dict) -> None:
    async with session.post(url + "/v1/invoke", data=body, headers={**headers, MODEL_ID_HEADER: model_id}) as response:
        text = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{model_id}: HTTP {response.status} {text[:300]!r}")


async def load(session: aiohttp.ClientSession, url: str, model_id: str) -> tuple[float, float]:
    """Seconds of one load through the replica's load endpoint: as the client sees them, and as
    the replica counts them (its cache's wait for the model)."""
    started = time.perf_counter()
    async with session.post(f"{url}/v1/models/{model_id}/load") as response:
        text = await response.read()
        if response.status != 200:
            raise RuntimeError(f"loading {model_id}: HTTP {response.status} {text[:300]!r}")
    return time.perf_counter() - started, json.loads(text)["seconds"]


def pick(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# -- neighbours ---------------------------------------------------------------------------------

def calibrate_rows(target_ms: float) -> tuple[int, float]:
    """Rows per steady request for a forward of about ``target_ms`` on one thread."""
    torch.set_num_threads(1)
    module = Block(**SWAP_KWARGS).eval()
    rows, ms = 1, 0.0
    with torch.inference_mode():
        for rows in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
            x = torch.randn(rows, SWAP_KWARGS["width"])
            module(x)
            times = []
            for _ in range(15):
                started = time.perf_counter()
                module(x)
                times.append(time.perf_counter() - started)
            ms = statistics.median(times) * 1000
            if ms >= target_ms:
                break
    return rows, ms


async def phase(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict, seconds: float,
                loads_per_s: float) -> dict:
    """2 closed-loop clients of the steady model for ``seconds``, with loads beside them or not."""
    latencies: list[float] = []
    load_times: list[float] = []
    stop_at = time.perf_counter() + seconds + 0.5

    async def client() -> None:
        while time.perf_counter() < stop_at and len(latencies) < MAX_REQUESTS:
            started = time.perf_counter()
            await infer(session, url, STEADY, body, headers)
            if started >= measure_from:
                latencies.append(time.perf_counter() - started)

    async def swapper() -> None:
        index = 0
        while time.perf_counter() < stop_at and index < MAX_REQUESTS:
            started = time.perf_counter()
            seconds_taken, _ = await load(session, url, f"s{index % SWAP_MODELS}")
            if started >= measure_from:
                load_times.append(seconds_taken)
            index += 1
            await asyncio.sleep(max(0.0, 1 / loads_per_s - (time.perf_counter() - started)))

    measure_from = time.perf_counter() + 0.5  # the loads reach their pace first
    tasks = [client(), client()] + ([swapper()] if loads_per_s else [])
    await asyncio.gather(*tasks)
    return {"requests": len(latencies), "rps": len(latencies) / seconds, "p50_ms": pick(latencies, 0.5) * 1000,
            "p99_ms": pick(latencies, 0.99) * 1000, "loads": len(load_times), "loads_per_s": len(load_times) / seconds,
            "load_p50_ms": pick(load_times, 0.5) * 1000 if load_times else None}


async def neighbours(args: argparse.Namespace, folder: Path) -> dict:
    rows, forward_ms = calibrate_rows(args.forward_ms)
    print(f"steady model: {rows} rows a request, forward {forward_ms:.1f} ms on one thread", file=sys.stderr)
    names = [STEADY] + [f"s{i}" for i in range(SWAP_MODELS)]
    variants: list[tuple[str, Path | None, str]] = []
    if args.before:
        variants.append(("before (TorchScript)", Path(args.before), "torchscript"))
    variants += [("after, TorchScript", None, "torchscript"), ("after, safetensors", None, "safetensors")]
    nbytes = {}
    for fmt in {v[2] for v in variants}:
        nbytes[fmt] = save_models(folder / fmt / "models", fmt, names, SWAP_KWARGS)
    body, headers = oip_body(rows, SWAP_KWARGS["width"])
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in variants}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        for round_index in range(args.rounds):
            order = variants[round_index % len(variants):] + variants[:round_index % len(variants)]
            for label, code_root, fmt in order:
                manifest = write_manifest(folder / fmt, "swap", f"file:models/{{model_id}}.{EXTENSIONS[fmt]}", fmt,
                                          SWAP_KWARGS, max_models=2)
                port, log = free_port(), folder / f"replica-{len(runs[label])}-{fmt}.log"
                process = start_replica(manifest, port, log, code_root)
                url = f"http://127.0.0.1:{port}"
                try:
                    await wait_ready(session, url, process, log)
                    for _ in range(20):
                        await infer(session, url, STEADY, body, headers)
                    result = {}
                    phases = [("quiet", 0.0), ("swaps", args.loads_per_s)]
                    for name, rate in (phases if round_index % 2 == 0 else phases[::-1]):
                        result[name] = await phase(session, url, body, headers, args.seconds, rate)
                    runs[label].append(result)
                    print(f"round {round_index + 1} {label}: quiet p99 {result['quiet']['p99_ms']:.1f} ms "
                          f"{result['quiet']['rps']:.0f}/s; swaps p99 {result['swaps']['p99_ms']:.1f} ms "
                          f"{result['swaps']['rps']:.0f}/s, {result['swaps']['loads_per_s']:.1f} loads/s",
                          file=sys.stderr)
                finally:
                    stop(process, grace=20)
    return {"rows": rows, "forward_ms": forward_ms, "model_bytes": nbytes, "loads_per_s_asked": args.loads_per_s,
            "seconds": args.seconds, "runs": runs}


def neighbours_table(result: dict) -> str:
    lines = ["| variant | p99 quiet ms | p99 with loads ms | p99 ratio | throughput ratio | loads/s | load p50 ms |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, runs in result["runs"].items():
        med = lambda f: statistics.median(f(run) for run in runs)  # noqa: E731
        lines.append(
            f"| {label} | {med(lambda r: r['quiet']['p99_ms']):.1f} | {med(lambda r: r['swaps']['p99_ms']):.1f} | "
            f"{med(lambda r: r['swaps']['p99_ms'] / r['quiet']['p99_ms']):.2f} | "
            f"{med(lambda r: r['swaps']['rps'] / r['quiet']['rps']):.1%} | {med(lambda r: r['swaps']['loads_per_s']):.2f} | "
            f"{med(lambda r: r['swaps']['load_p50_ms'] or float('nan')):.1f} |")
    return "\n".join(lines)


# -- speed ----------------------------------------------------------------------------------------

STORE = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static("/models", sys.argv[1])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None)
"""


async def download(session: aiohttp.ClientSession, url: str) -> float:
    started = time.perf_counter()
    async with session.get(url) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
    return time.perf_counter() - started


def read_plain(path: Path) -> float:
    started = time.perf_counter()
    path.read_bytes()
    return time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system; Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def speed(args: argparse.Namespace, folder: Path) -> dict:
    """Each case's loads beside a plain read of the same bytes, one replica per variant (the
    checkout from ``--before`` and this one), variants taking turns within each repetition."""
    points = []
    store_port = free_port()
    store = spawn([sys.executable, "-c", STORE, str(folder), str(store_port)], log=folder / "store.log")
    timeout = aiohttp.ClientTimeout(total=300)
    variants: list[tuple[str, Path | None]] = [("before", Path(args.before))] if args.before else []
    variants.append(("after", None))
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            cases = [(size, fmt, "file") for size in SIZES for fmt in EXTENSIONS] + \
                    [("256MB", fmt, "http") for fmt in EXTENSIONS]
            for size, fmt, scheme in cases:
                if args.only and f"{size}-{fmt}-{scheme}" not in args.only:
                    continue
                kwargs = SIZES[size]
                where = folder / f"{size}-{fmt}"
                nbytes = save_models(where / "models", fmt, ["a", "b"], kwargs)
                ext = EXTENSIONS[fmt]
                uri = f"file:models/{{model_id}}.{ext}" if scheme == "file" else \
                    f"http://127.0.0.1:{store_port}/models/{size}-{fmt}/models/{{model_id}}.{ext}"
                if scheme == "http":
                    await wait_for_async(lambda: _listening(store_port), 30, 0.1, "the model store")
                manifest = write_manifest(where, f"speed-{scheme}", uri, fmt, kwargs, max_models=1)
                replicas = {}
                for label, code_root in variants:
                    port, log = free_port(), where / f"replica-{scheme}-{label}.log"
                    replicas[label] = (start_replica(manifest, port, log, code_root), f"http://127.0.0.1:{port}", log)
                body, headers = oip_body(1, kwargs["width"])
                plain: list[float] = []
                plain_cpu: list[float] = []
                samples: dict[str, dict[str, list[float]]] = {
                    label: {"loads": [], "inside": [], "firsts": [], "cpu": []} for label in replicas}
                try:
                    for process, url, log in replicas.values():
                        await wait_ready(session, url, process, log)
                    reps = args.rounds if size != "1MB" else max(args.rounds, 10)  # small: cheap, noisy
                    for rep in range(reps + 1):  # the first pair warms page cache and code
                        name = "ab"[rep % 2]
                        cpu_before = time.process_time()
                        if scheme == "file":
                            base = read_plain(where / "models" / f"{name}.{ext}")
                        else:
                            base = await download(session, uri.replace("{model_id}", name))
                        if rep:
                            plain.append(base)
                            plain_cpu.append(time.process_time() - cpu_before)
                        order = list(replicas) if rep % 2 else list(replicas)[::-1]
                        for label in order:
                            process, url, _ = replicas[label]
                            cpu_before = cpu_seconds(process.pid)
                            took, server = await load(session, url, name)
                            cpu = cpu_seconds(process.pid) - cpu_before
                            started = time.perf_counter()
                            await infer(session, url, name, body, headers)
                            first = time.perf_counter() - started
                            if rep:
                                for key, value in (("loads", took), ("inside", server), ("firsts", first),
                                                   ("cpu", cpu)):
                                    samples[label][key].append(value)
                finally:
                    for process, _, _ in replicas.values():
                        stop(process, grace=20)
                for label, got in samples.items():
                    point = {"size": size, "format": fmt, "source": scheme, "variant": label, "bytes": nbytes,
                             "samples": len(got["loads"]),
                             "load_ms": statistics.median(got["loads"]) * 1000,
                             "load_ms_range": [min(got["loads"]) * 1000, max(got["loads"]) * 1000],
                             "load_in_replica_ms": statistics.median(got["inside"]) * 1000,
                             "load_cpu_ms": statistics.median(got["cpu"]) * 1000,
                             "plain_ms": statistics.median(plain) * 1000,
                             "plain_ms_range": [min(plain) * 1000, max(plain) * 1000],
                             "plain_cpu_ms": statistics.median(plain_cpu) * 1000,
                             "ratios": [took / base for took, base in zip(got["loads"], plain)],
                             "first_answer_ms": statistics.median(got["firsts"]) * 1000}
                    point["ratio"] = statistics.median(point["ratios"])  # of each load to its own plain read
                    points.append(point)
                    print(f"{size} {fmt} {scheme} {label}: load {point['load_ms']:.1f} ms, plain "
                          f"{point['plain_ms']:.1f} ms ({point['ratio']:.2f}x), then first answer "
                          f"{point['first_answer_ms']:.1f} ms", file=sys.stderr)
    finally:
        stop(store, grace=5)
    return {"rounds": args.rounds, "variants": [label for label, _ in variants], "points": points}


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def speed_table(result: dict) -> str:
    lines = ["| model | format | source | variant | load ms (in the replica) [range] | replica CPU ms | "
             "plain ms [range] | plain CPU ms | load / plain | first answer after ms |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for p in result["points"]:
        plain = "download" if p["source"] == "http" else "read"
        low, high = p.get("load_ms_range", (p["load_ms"], p["load_ms"]))
        plain_low, plain_high = p.get("plain_ms_range", (p["plain_ms"], p["plain_ms"]))
        lines.append(f"| {p['size']} ({p['bytes'] / 2**20:.1f} MiB) | {p['format']} | {p['source']} | "
                     f"{p.get('variant', 'after')} | {p['load_ms']:.1f} ({p['load_in_replica_ms']:.1f}) "
                     f"[{low:.0f}-{high:.0f}] | {p.get('load_cpu_ms', float('nan')):.0f} | "
                     f"{p['plain_ms']:.1f} ({plain}) [{plain_low:.0f}-{plain_high:.0f}] | "
                     f"{p.get('plain_cpu_ms', float('nan')):.0f} | {p['ratio']:.2f} | {p['first_answer_ms']:.1f} |")
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------

async def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="modelplex-swap-") as tmp:
        folder = Path(tmp)
        if args.what == "neighbours":
            result = await neighbours(args, folder)
            table = neighbours_table(result)
        else:
            result = await speed(args, folder)
            table = speed_table(result)
    result["machine"] = {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "torch": torch.__version__}
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.what}.json").write_text(json.dumps(result, indent=1))
        (out / f"{args.what}.md").write_text(table + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["neighbours", "speed"])
    parser.add_argument("--before", help="a checkout of the code before (git worktree add --detach DIR HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians over them)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per phase")
    parser.add_argument("--loads-per-s", type=float, default=5.0, help="loads asked per second beside the steady model")
    parser.add_argument("--forward-ms", type=float, default=6.0, help="the steady forward's target on one thread")
    parser.add_argument("--out", help="folder for <what>.json and <what>.md")
    parser.add_argument("--only", nargs="+", help="speed: only these cases, SIZE-FORMAT-SOURCE (256MB-torchscript-http)")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
