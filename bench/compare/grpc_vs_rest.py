"""The router's two fronts on one stack: the Open Inference Protocol over gRPC (``ModelInfer``)
beside JSON over HTTP, the same handler, rows and concurrencies, in alternating sweeps.

    .venv/bin/python bench/compare/grpc_vs_rest.py [--handler BatchedMLP|GPUBatchedMLP|BatchedEcho]
        [--concurrency 1 8 32 64] [--rounds 3] [--seconds 5] [--out results.json]

One ``modelplex local`` (one replica, ``router.grpcPort`` set) serves both fronts; each round
sweeps REST then gRPC, the next gRPC then REST, so drifting background load reaches both
alike; each point's figures are the medians over rounds. gRPC sends the row as one FP32 tensor
of raw contents (as tritonclient does); REST sends it as a JSON list. Prints a markdown table,
with each point's CPU per request in the router, the replica and this load generator: on a
small machine they share the cores, so a front whose client costs more gets less of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402
import run  # noqa: E402
from ab_batched import cpu_seconds  # noqa: E402
from handlers import GPU_MLP_SIZES, MLP_SIZES  # noqa: E402

from modelplex.processes import free_port  # noqa: E402

FIGURES = ("rps", "p50_ms", "p99_ms", "router_cpu_ms", "replica_cpu_ms", "client_cpu_ms")


def sweep(front: str, stack: run.ModelplexStack, grpc_address: str, body: dict, args: argparse.Namespace) -> dict:
    out = {}
    pids = stack.pids()
    for c in args.concurrency:
        before, client_before = cpu_seconds(pids), time.process_time()
        if front == "rest":
            point = asyncio.run(loadgen.unary(stack.url, body, c, args.seconds, warmup_s=args.warmup))
        else:
            point = asyncio.run(loadgen.unary_grpc(grpc_address, "mlp", body["inputs"], c, args.seconds,
                                                   warmup_s=args.warmup))
        after, client_after = cpu_seconds(pids), time.process_time()
        s = point.summary()
        # CPU is read around warm-up and measurement alike; the requests of the warm-up are taken
        # to come at the measured rate.
        answered = max(1.0, (point.ok + point.errors) * (args.seconds + args.warmup) / args.seconds)
        for role in ("router", "replica"):
            s[f"{role}_cpu_ms"] = round(1000 * (after.get(role, 0.0) - before.get(role, 0.0)) / answered, 3)
        s["client_cpu_ms"] = round(1000 * (client_after - client_before) / answered, 3)
        run.log(f"{front:4s} c={c:<3d} {s['rps']:8.1f} req/s  p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms  "
                f"errors {s['errors']}")
        out[c] = s
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handler", default="BatchedMLP", choices=["BatchedMLP", "GPUBatchedMLP", "BatchedEcho"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    width = (GPU_MLP_SIZES if args.handler == "GPUBatchedMLP" else MLP_SIZES)[0]
    body = run.mlp_body(width)
    grpc_port = free_port()
    spec = {"replicas": 1, "handler": f"mp_handlers:{args.handler}", "maxOngoingRequests": 256,
            "router": {"grpcPort": grpc_port}}
    rounds: dict[str, list[dict]] = {"rest": [], "grpc": []}
    with tempfile.TemporaryDirectory(prefix="modelplex-grpc-rest-") as tmp, \
            run.ModelplexStack(Path(tmp), "grpc-rest", spec, run.bench_env()) as stack:
        for i in range(args.rounds):
            for front in (("rest", "grpc") if i % 2 == 0 else ("grpc", "rest")):
                rounds[front].append(sweep(front, stack, f"127.0.0.1:{grpc_port}", body, args))
    medians = {front: {c: {f: statistics.median(r[c][f] for r in runs) for f in FIGURES} for c in args.concurrency}
               for front, runs in rounds.items()}
    errors = {front: sum(r[c]["errors"] for r in runs for c in args.concurrency) for front, runs in rounds.items()}
    summary = {"command": "python bench/compare/grpc_vs_rest.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "environment": run.environment(),
               "handler": args.handler, "rounds": rounds, "medians": medians, "errors": errors}
    print(markdown(summary, args.concurrency))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return 0


def markdown(summary: dict, concurrency: list[int]) -> str:
    rest, grpc = summary["medians"]["rest"], summary["medians"]["grpc"]
    lines = [f"{summary['handler']}, one replica, medians of {len(summary['rounds']['rest'])} alternating rounds; "
             f"errors REST {summary['errors']['rest']}, gRPC {summary['errors']['grpc']}", "",
             "| concurrency | REST req/s | gRPC req/s | gRPC / REST | REST p50 ms | gRPC p50 ms | REST p99 ms | gRPC p99 ms "
             "| CPU ms/req REST (router + replica + client) | gRPC (router + replica + client) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cpu(point: dict) -> str:
        return f"{point['router_cpu_ms']:.2f} + {point['replica_cpu_ms']:.2f} + {point['client_cpu_ms']:.2f}"

    for c in concurrency:
        r, g = rest[c], grpc[c]
        lines.append(f"| {c} | {r['rps']:.1f} | {g['rps']:.1f} | {g['rps'] / r['rps']:.2f} | {r['p50_ms']:.2f} | "
                     f"{g['p50_ms']:.2f} | {r['p99_ms']:.2f} | {g['p99_ms']:.2f} | {cpu(r)} | {cpu(g)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
