"""Where a load's time goes, in one process: for each way of loading a ~50 MB model, its wall
time, the CPU time of the thread that loads, and how long the rest of the process was kept
waiting: the longest stall of an asyncio loop ticking every millisecond while the load runs in
``asyncio.to_thread`` (as the replica's serving loop does), which is the longest time the load
held the GIL.

    .venv/bin/python bench/swap/profile_load.py [--repeat 5]
    .venv/bin/python bench/swap/profile_load.py --neighbour [--repeat 3]
    .venv/bin/python bench/swap/profile_load.py --http [--repeat 5]

``--neighbour``: instead, a neighbour's forward passes (one intra-op thread, the steady model of
``run.py``) in one thread while another loads 50 MB models at 4 loads/s, for each way of
loading, with the loading thread at normal priority and at niceness 19 (``os.setpriority`` on
the thread alone, as a replica could do): the neighbour's p50/p99 and the loads reached.

``--http``: instead, a 50.4 MB download from a loopback store on the serving loop itself (where
the built-in handler downloads), each way: a plain ``read()``, into one buffer, into an
anonymous file: wall, the process's CPU and the loop's longest stall.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from nets import Block  # noqa: E402 - the benchmark's own model class, beside this file

from modelplex_replica.sources import anonymous_file, fd_path, write_all  # noqa: E402
from modelplex_replica.statedict import build_module, read_bytes, read_file  # noqa: E402
from modelplex_replica.warm import read_into_buffer  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)  # TorchScript's deprecation notice


def ways(folder: Path) -> dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    module = Block().eval()
    ts, st, pt = folder / "m.pt", folder / "m.safetensors", folder / "m.pth"
    torch.jit.save(torch.jit.script(module), str(ts))
    save_file(module.state_dict(), str(st))
    torch.save(module.state_dict(), str(pt))

    def meta_block(tensors: dict) -> torch.nn.Module:
        return build_module("m", Block, {}, tensors)

    def from_anonymous_file(path: Path, load: Callable[[Path], object]) -> object:
        """The bytes written into an anonymous file (as an http(s) body is, chunk by chunk), then
        loaded by the file's path."""
        with anonymous_file() as file:
            data, at = memoryview(path.read_bytes()), 0
            while at < len(data):
                write_all(file, data[at:at + (1 << 16)])
                at += 1 << 16
            return load(Path(fd_path(file)))

    return {
        "plain read of the bytes": lambda: ts.read_bytes(),
        "TorchScript from bytes (before: http, s3, disk tier)": lambda: torch.jit.load(
            io.BytesIO(ts.read_bytes())),
        "TorchScript from its path (built-in handler: file:)": lambda: torch.jit.load(str(ts)),
        "TorchScript written to an anonymous file, then by its path (built-in handler: http, s3)": lambda: (
            from_anonymous_file(ts, lambda path: torch.jit.load(str(path)))),
        "safetensors, mapped (built-in handler: file:, disk tier)": lambda: meta_block(read_file("m", st)[0]),
        "safetensors written to an anonymous file, mapped (built-in handler: http, s3)": lambda: meta_block(
            from_anonymous_file(st, lambda path: read_file("m", path)[0])),
        "safetensors viewed in a read buffer (before: http, disk tier)": lambda: meta_block(
            read_bytes("m", read_into_buffer(st))[0]),
        "safetensors from immutable bytes, one copy (before: s3)": lambda: meta_block(
            read_bytes("m", st.read_bytes())[0]),
        "torch.load(mmap=True) state_dict into a meta module": lambda: meta_block(
            torch.load(str(pt), mmap=True, weights_only=True)),
        "torch.load state_dict (no mmap), built for real": lambda: Block().load_state_dict(
            torch.load(str(pt), weights_only=True)),
    }


async def measure(load: Callable[[], object], on_loop: bool = False) -> tuple[float, float, float]:
    """(wall s, load thread CPU s, longest loop stall s) of one load in a worker thread, or
    (``on_loop``: ``load`` returns a coroutine) on the loop itself, its CPU then the process's."""
    stalls: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            stalls.append(now - last - 0.001)
            last = now

    def timed() -> float:
        started = time.thread_time()
        load()
        return time.thread_time() - started

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    cpu_started = time.process_time()
    started = time.perf_counter()
    if on_loop:
        await load()  # type: ignore[misc]  # a coroutine, as the docstring says
        cpu = time.process_time() - cpu_started
    else:
        cpu = await asyncio.to_thread(timed)
    wall = time.perf_counter() - started
    done = True
    await tick
    return wall, cpu, max(stalls, default=0.0)


async def run(repeat: int) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="modelplex-profile-") as tmp:
        table = ways(Path(tmp))
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in table}
        for _ in range(repeat + 1):  # interleaved; the first pass warms page cache and code
            for name, load in table.items():
                results[name].append(await measure(load))
    print("| load | wall ms | load thread CPU ms | longest loop stall ms |")
    print("|---|---:|---:|---:|")
    for name, samples in results.items():
        wall, cpu, stall = (statistics.median(s[i] for s in samples[1:]) * 1000 for i in range(3))
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {stall:.1f} |")


def neighbour(load: Callable[[], object], nice: bool, seconds: float) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, loads/s) of a forward loop beside a thread loading at 4/s."""
    torch.manual_seed(0)
    steady, x = Block().eval(), torch.randn(1, 1024)
    stop = threading.Event()
    loads = 0

    def loader() -> None:
        nonlocal loads
        if nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while not stop.is_set() and loads < 10_000:
            started = time.perf_counter()
            load()
            loads += 1
            stop.wait(max(0.0, 0.25 - (time.perf_counter() - started)))

    thread = threading.Thread(target=loader)
    latencies: list[float] = []
    with torch.inference_mode():
        thread.start()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and len(latencies) < 1_000_000:
            started = time.perf_counter()
            steady(x)
            latencies.append(time.perf_counter() - started)
    stop.set()
    thread.join()
    latencies.sort()
    return (latencies[len(latencies) // 2] * 1000, latencies[int(0.99 * len(latencies))] * 1000, loads / seconds)


def run_neighbour(repeat: int, seconds: float = 5.0) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="modelplex-profile-") as tmp:
        table = ways(Path(tmp))
        chosen = {name: table[name] for name in table if name.startswith(("TorchScript", "safetensors, mapped"))}
        chosen["nothing (no loads)"] = lambda: time.sleep(0.25)
        results: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
        for index in range(repeat):  # interleaved
            for name, load in chosen.items():
                for nice in ((False, True) if index % 2 == 0 else (True, False)):
                    results.setdefault((name, nice), []).append(neighbour(load, nice, seconds))
    print("| loads beside the neighbour | loading thread | neighbour p50 ms | neighbour p99 ms | loads/s |")
    print("|---|---|---:|---:|---:|")
    for (name, nice), samples in results.items():
        p50, p99, rate = (statistics.median(s[i] for s in samples) for i in range(3))
        print(f"| {name} | {'nice 19' if nice else 'normal'} | {p50:.1f} | {p99:.1f} | {rate:.1f} |")


STORE = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static("/models", sys.argv[1])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None)
"""


async def run_http(repeat: int) -> None:
    """A model's http(s) download on the serving loop: a plain ``read()``, into one buffer (the
    built-in handler before), into an anonymous file (now), from a store in its own process."""
    import aiohttp

    from modelplex.processes import free_port, spawn, stop, wait_for_async
    from modelplex_replica.sources import ModelSource

    with tempfile.TemporaryDirectory(prefix="modelplex-profile-") as tmp:
        ways(Path(tmp))  # m.pt, the 50.4 MB TorchScript file
        port = free_port()
        store = spawn([sys.executable, "-c", STORE, tmp, str(port)], log=Path(tmp) / "store.log")
        source = ModelSource(f"http://127.0.0.1:{port}/models/{{model_id}}.pt")
        try:
            async with aiohttp.ClientSession() as session:
                async def plain() -> bool:
                    async with session.get(source.locate("m")) as response:
                        return len(await response.read()) > 0  # True: what the store wait checks

                async def to_file() -> None:
                    (await source.fetch_file("m")).close()

                table = {"plain download, `read()`": plain,
                         "into one buffer (before: the built-in handler's http)": lambda: source.fetch("m"),
                         "into an anonymous file (built-in handler: http)": to_file}
                await wait_for_async(plain, 30, 0.2, "the model store", retry_on=(aiohttp.ClientError,))
                results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in table}
                for _ in range(repeat + 1):  # interleaved; the first pass warms up
                    for name, fetch in table.items():
                        results[name].append(await measure(fetch, on_loop=True))
        finally:
            stop(store, grace=5)
    print("| 50.4 MB over http on loopback | wall ms | process CPU ms | longest loop stall ms |")
    print("|---|---:|---:|---:|")
    for name, samples in results.items():
        wall, cpu, stall = (statistics.median(s[i] for s in samples[1:]) * 1000 for i in range(3))
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {stall:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--neighbour", action="store_true", help="a neighbour's p99 beside loads, niced or not")
    parser.add_argument("--http", action="store_true", help="an http download on the serving loop, by way")
    args = parser.parse_args()
    if args.neighbour:
        run_neighbour(args.repeat)
    elif args.http:
        asyncio.run(run_http(args.repeat))
    else:
        asyncio.run(run(args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
