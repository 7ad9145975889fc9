"""What the replica's HTTP costs per request, against aiohttp alone and a minimal HTTP/1.1 server.

    .venv/bin/python bench/replica/http_floor.py [--seconds 6] [--rounds 2] [--concurrency 32]

Three servers do the same work for each request (read a JSON body of 512 floats, answer the
first 8 as JSON), each in a process of its own on uvloop, driven in turn by the same closed
loop of clients (``bench_replica.closed_loop``), the order rotated each round:

- ``minimal``: an ``asyncio.Protocol`` that finds the headers' end and ``Content-Length``,
  and writes its answer in one call: about the least any Python HTTP/1.1 server can cost;
- ``aiohttp``: a bare ``web.Application`` with one route (no middleware);
- ``replica``: ``modelplex replica`` with a plain ``async def`` handler (:class:`Echo`), the
  path every request to a Modelplex replica takes: credentials off (a replica on loopback),
  no batching, no model.

It prints each server's CPU per request (µs, from /proc) and throughput. The replica's thread
is the serial part of the batched workload (``bench/results/small-machine-2026-11-28c``): what
it spends beyond ``minimal`` is the most that leaving aiohttp, or trimming the replica's own
path, could save a request there.
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
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
SERVERS = ("minimal", "aiohttp", "replica")


def answer(body: bytes) -> bytes:
    """Every server's work: the request's first 8 inputs, as JSON."""
    return orjson.dumps({"outputs": orjson.loads(body)["inputs"][:8]})


class Echo:
    """The replica's handler: the same work, as a user writes it (the replica decodes the JSON)."""

    async def __call__(self, body: dict) -> dict:
        return {"outputs": body["inputs"][:8]}


class MinimalHTTP(asyncio.Protocol):
    """Keep-alive HTTP/1.1 for one client that sends well-formed requests with a
    ``Content-Length``; nothing else (a floor to measure against, not a server to use)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            head = buffer[:end].lower()
            at = head.find(b"content-length:")
            line_end = head.find(b"\r\n", at)
            length = int(head[at + 15:line_end if line_end >= 0 else len(head)]) if at >= 0 else 0
            if len(buffer) < end + 4 + length:
                break
            body, buffer = buffer[end + 4:end + 4 + length], buffer[end + 4 + length:]
            out = answer(body)
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"  # type: ignore[attr-defined]
                                 % (len(out), out))
        self.buffer = buffer


async def serve(kind: str, port: int) -> None:
    from aiohttp import web

    if kind == "minimal":
        await asyncio.get_running_loop().create_server(MinimalHTTP, "127.0.0.1", port)
    else:
        async def invoke(request: web.Request) -> web.Response:
            return web.Response(body=answer(await request.read()), content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/invoke", invoke)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def start(kind: str, port: int, folder: Path) -> subprocess.Popen:
    from bench_replica import start_replica

    from modelplex.processes import spawn

    if kind == "replica":
        manifest = folder / "echo.json"
        manifest.write_text(json.dumps({
            "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "floor"},
            "spec": {"image": "local", "handler": "http_floor:Echo", "maxOngoingRequests": 256},
        }))
        return start_replica(manifest, port, folder / "replica.log")
    return spawn([sys.executable, __file__, "--serve", kind, "--port", str(port)], log=folder / f"{kind}.log")


async def measure(kind: str, concurrency: int, seconds: float, folder: Path) -> dict:
    from bench_replica import closed_loop, wait_ready
    from profile_modelplex import cpu_seconds

    from modelplex.processes import free_port, stop

    port = free_port()
    process = start(kind, port, folder)
    try:
        url = f"http://127.0.0.1:{port}"
        if kind == "replica":
            await wait_ready(url)
        else:
            await asyncio.sleep(1.5)
        await closed_loop(url, concurrency, 1.0)  # warm (closed_loop warms up 1 s itself, too)
        before, started = cpu_seconds(process.pid), time.perf_counter()
        result = await closed_loop(url, concurrency, seconds)
        cpu = cpu_seconds(process.pid) - before
        wall = time.perf_counter() - started
    finally:
        stop(process, grace=10)
    return {**result, "server_cores": round(cpu / wall, 3),
            "server_us_per_request": round(cpu / max(1, result["requests"]) * 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", choices=SERVERS[:2], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvloop

        uvloop.run(serve(args.serve, args.port))
        return 0
    sys.path[:0] = [str(HERE), str(HERE.parent / "compare")]  # bench_replica; profile_modelplex's cpu_seconds
    # The replica imports its handler (``http_floor:Echo``) from here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    runs: dict[str, list[dict]] = {kind: [] for kind in SERVERS}
    with tempfile.TemporaryDirectory(prefix="http-floor-") as tmp:
        for round_number in range(args.rounds):
            order = SERVERS[round_number % 3:] + SERVERS[:round_number % 3]
            for kind in order:
                run = asyncio.run(measure(kind, args.concurrency, args.seconds, Path(tmp)))
                runs[kind].append(run)
                print(f"round {round_number + 1} {kind:8s} {run['rps']:8.0f} req/s  server {run['server_cores']:.2f} "
                      f"cores, {run['server_us_per_request']:6.1f} us/request  errors {run['errors']}", file=sys.stderr)
    print(f"\nconcurrency {args.concurrency}, medians of {args.rounds} rounds of {args.seconds:g} s\n")
    print("| server | req/s | server CPU µs/request |")
    print("|---|---:|---:|")
    for kind, results in runs.items():
        print(f"| {kind} | {statistics.median(r['rps'] for r in results):,.0f} | "
              f"{statistics.median(r['server_us_per_request'] for r in results):.1f} |")
    if args.out is not None:
        args.out.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
