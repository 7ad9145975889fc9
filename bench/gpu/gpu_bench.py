"""The GPU warm tier measured on a GPU, in one process (``bench/gpu/run.sh`` runs it).

- **copy**: for models of about 50 MB, 500 MB and 2 GB (fp32 ``Linear`` stacks), the warm
  tier's copy back (:class:`~modelplex_replica.warm.HostTier`: pinned host memory, non-blocking
  copies on the tier's own stream) against torch's raw pinned-host-to-device copy of the same
  bytes in the same run (one buffer, and the model's own tensors), and swap-in to first
  answer (the copy back, then a one-row forward, its answer on the host);
- **neighbour**: a co-resident model served by a thread (each request's answer copied to the
  host, as the built-in handler does) while the 500 MB model goes to the tier and back over
  and over: its p99 and throughput against the same without swaps.

Prints markdown; with no GPU it says so and measures nothing. Medians of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time

import torch

from modelplex_replica.warm import HostTier

#: (name, width, depth): fp32 Linear stacks of about these sizes.
SIZES = (("50 MB", 1024, 12), ("500 MB", 4096, 8), ("2 GB", 8192, 8))


def stack(width: int, depth: int, device: torch.device) -> torch.nn.Module:
    with torch.device(device):
        return torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(depth))).eval()


def nbytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.parameters())


def synced(device: torch.device) -> float:
    torch.cuda.synchronize(device)
    return time.perf_counter()


def raw_copy_s(tensors: list[torch.Tensor], device: torch.device) -> float:
    """Pinned host to device, non-blocking on a side stream, waited for: torch's own speed."""
    stream = torch.cuda.Stream(device)
    started = synced(device)
    with torch.cuda.stream(stream):
        copies = [t.to(device, non_blocking=True) for t in tensors]
    stream.synchronize()
    took = time.perf_counter() - started
    del copies
    return took


async def copy_point(name: str, width: int, depth: int, device: torch.device, repeat: int) -> dict:
    model = stack(width, depth, device)
    size = nbytes(model)
    one_buffer = [torch.empty(size, dtype=torch.uint8, pin_memory=True)]
    tier = HostTier(size * 2, device)
    x = torch.randn(1, width, device=device)
    raw, raw_tensors, warm, first = [], [], [], []
    for _ in range(repeat + 1):  # the first round warms the allocators
        raw.append(raw_copy_s(one_buffer, device))
        assert await tier.keep("m", model, size)
        raw_tensors.append(raw_copy_s(list(model.parameters()), device))  # the model's pinned tensors
        started = synced(device)
        back = await tier.take("m")
        copied = time.perf_counter()
        with torch.inference_mode():
            back(x).cpu()
        answered = time.perf_counter()
        warm.append(copied - started)
        first.append(answered - started)
    await tier.close()
    del model, back, one_buffer
    torch.cuda.empty_cache()
    med = lambda values: statistics.median(values[1:])  # noqa: E731
    point = {"size": name, "bytes": size, "raw_s": med(raw), "raw_tensors_s": med(raw_tensors), "warm_s": med(warm),
             "first_answer_s": med(first)}
    point["raw_gbps"] = size / point["raw_s"] / 1e9
    point["warm_gbps"] = size / point["warm_s"] / 1e9
    point["share_of_raw"] = point["raw_s"] / point["warm_s"]
    point["first_bound_s"] = 1.2 * point["raw_s"] + 0.010
    return point


def serve(model: torch.nn.Module, x: torch.Tensor, seconds: float, latencies: list[float]) -> None:
    deadline = time.perf_counter() + seconds
    with torch.inference_mode():
        while time.perf_counter() < deadline and len(latencies) < 1_000_000:
            started = time.perf_counter()
            model(x).cpu()
            latencies.append(time.perf_counter() - started)


async def neighbour_phase(device: torch.device, swaps: bool, seconds: float) -> dict:
    steady = stack(4096, 4, device)
    x = torch.randn(64, 4096, device=device)
    other = stack(4096, 8, device)
    tier = HostTier(nbytes(other) * 2, device)
    latencies: list[float] = []
    with torch.inference_mode():
        for _ in range(20):
            steady(x).cpu()
    thread = threading.Thread(target=serve, args=(steady, x, seconds, latencies))
    thread.start()
    cycles = 0
    deadline = time.perf_counter() + seconds
    while swaps and time.perf_counter() < deadline and cycles < 10_000:
        assert await tier.keep("other", other, nbytes(other))
        await tier.take("other")
        cycles += 1
    await asyncio.to_thread(thread.join)
    await tier.close()
    latencies.sort()
    return {"p50_ms": latencies[len(latencies) // 2] * 1000, "p99_ms": latencies[int(0.99 * len(latencies))] * 1000,
            "rps": len(latencies) / seconds, "swaps_per_s": cycles / seconds,
            "swap_gbps": cycles * 2 * nbytes(other) / seconds / 1e9}


async def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("## GPU warm tier\n\nNo GPU here (torch.cuda.is_available() is False): the copy and neighbour "
              "measurements were skipped.")
        return 0
    device = torch.device("cuda")
    print(f"## GPU warm tier ({torch.cuda.get_device_name(device)}, torch {torch.__version__})\n")
    print("Copy back from the warm tier against torch's raw pinned-to-device copy of the same bytes "
          f"(medians of {args.repeat}):\n")
    print("| model | bytes | raw copy ms (GB/s) | raw, its tensors ms | warm tier ms (GB/s) | warm / raw | "
          "swap-in to first answer ms | bound 1.2 x copy + 10 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, width, depth in SIZES:
        if name not in args.sizes:
            continue
        p = await copy_point(name, width, depth, device, args.repeat)
        print(f"| {p['size']} | {p['bytes']:,} | {p['raw_s'] * 1000:.1f} ({p['raw_gbps']:.1f}) | "
              f"{p['raw_tensors_s'] * 1000:.1f} | {p['warm_s'] * 1000:.1f} ({p['warm_gbps']:.1f}) | "
              f"{p['share_of_raw']:.0%} | {p['first_answer_s'] * 1000:.1f} | {p['first_bound_s'] * 1000:.1f} |",
              flush=True)
    print(f"\nA co-resident model (4096x4 layers, 64 rows) served by a thread while a 537 MB model goes to "
          f"the tier and back continuously ({args.seconds:g} s a phase, phases alternate, medians of "
          f"{args.repeat}):\n")
    results: dict[bool, list[dict]] = {False: [], True: []}
    for index in range(args.repeat):
        for swaps in ((False, True) if index % 2 == 0 else (True, False)):
            results[swaps].append(await neighbour_phase(device, swaps, args.seconds))
    print("| phase | p50 ms | p99 ms | answers/s | swaps/s | GB/s moved |")
    print("|---|---:|---:|---:|---:|---:|")
    for swaps, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"| {'with swaps' if swaps else 'quiet'} | {med['p50_ms']:.2f} | {med['p99_ms']:.2f} | "
              f"{med['rps']:.0f} | {med['swaps_per_s']:.1f} | {med['swap_gbps']:.1f} |")
    quiet, busy = (statistics.median(r["p99_ms"] for r in results[s]) for s in (False, True))
    rate = statistics.median(r["rps"] for r in results[True]) / statistics.median(r["rps"] for r in results[False])
    print(f"\np99 with swaps / quiet: {busy / quiet:.2f}; throughput with swaps / quiet: {rate:.0%}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sizes", nargs="+", default=[name for name, _, _ in SIZES])
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
