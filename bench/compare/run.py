"""Modelplex vs Ray Serve, side by side, in one run, on the same handler code.

    .venv/bin/python bench/compare/run.py            # the full run (~15 min), results in bench/results/
    .venv/bin/python bench/compare/run.py --quick    # a smoke run (~4 min), results in bench/results/quick/

Workloads (handlers in ``handlers.py``, built once with ``modelplex`` and once with ``ray.serve``):

1. batching: a 512-2048-2048-512 torch MLP, one intra-op thread, one replica, unbatched and
   ``@batch``-ed (32 rows, 2 ms), closed-loop concurrency 1/8/32/64, beside the in-process
   compute bound; plus a GPU variant (a larger MLP, batches up to 256) where CUDA exists;
2. multiplexing: 40 models, Zipf(1.1), 2 replicas x 4 slots, each load a 100 ms fetch plus real
   construction; hit rate beside the offline Belady optimum of the same trace;
3. streaming: 20-chunk NDJSON streams, time to first chunk and throughput up to 256 streams;
4. busy: user code that computes on its event loop, as users write it (issue 10): an async
   generator computing each of its 20 chunks (a 48-row forward pass of the MLP) and an unbatched
   ``async def`` doing the same forward pass, one replica; errors per system, time to first
   chunk, and (Modelplex) the replica's ``/readyz`` latency and the router's "not ready" lines.

Both systems run as local processes (Ray: ``ray.init`` with 2 CPUs, Serve's proxy on
127.0.0.1; Modelplex: ``modelplex local``), one system at a time, alternating; the load
generator (``loadgen.py``) runs in this process. Everything started is stopped by process id.
As root, each system runs in a CPU cgroup of its own with the same quota (``--cpus``, 1 core;
``cgroups.py``), so that how the kernel splits a loaded machine between sessions does not
decide the comparison.
Writes ``README.md``, ``results.json`` and PNG plots to the output folder.

``--tree PATH`` runs Modelplex from another checkout of the repository (a ``git worktree``):
its packages go first on the path of every Modelplex process and it is their working directory,
so edits in progress in this checkout do not touch the numbers. The bench code is this one.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import aiohttp  # noqa: E402
import belady  # noqa: E402
import cgroups  # noqa: E402
import loadgen  # noqa: E402
import report  # noqa: E402
from handlers import (BATCH_MAX, BATCH_WAIT_S, BUSY_CHUNKS, BUSY_ROWS, GPU_BATCH_MAX, GPU_MLP_SIZES,  # noqa: E402
                      MLP_SIZES, MUX_SIZES, MUX_SLOTS, STREAM_CHUNKS, make_mlp)

from modelplex.processes import free_port  # noqa: E402

RAY = "Ray Serve"
MPX = "Modelplex"
WORKLOADS = ["batching", "multiplexing", "streaming", "busy", "gpu"]
#: The checkout whose Modelplex the stacks run (``--tree``); this one by default.
product_root = ROOT
#: The `modelplex` command's module by where it lives: a tree from before the launcher moved out
#: of the core (A/B runs against older commits) has it in modelplex/.
CLI_PATHS = {"modelplex_launcher.cli": "launcher/modelplex_launcher/cli.py", "modelplex.cli": "modelplex/cli.py"}


def cli_module() -> str:
    """The module that runs the `modelplex` command in the tree under test."""
    return next(module for module, path in CLI_PATHS.items() if (product_root / path).exists())


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


#: The CPU groups of this run (``--cpus``), or None: each system's processes in one of its own.
cpu_groups: cgroups.Groups | None = None


def groups_for(system: str) -> cgroups.CpuGroup | None:
    return cpu_groups.system(system) if cpu_groups is not None else None


# -- processes ---------------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, command name) for every process we can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry)] = (int(fields[1]), int(fields[3]), name)
    return table


def descendants(root: int) -> dict[int, str]:
    """Every process below ``root`` or in its session (Ray daemonizes some), by pid."""
    table = _proc_table()
    found = {pid: name for pid, (_, sid, name) in table.items() if sid == root and pid != root}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, name) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = name
                frontier.append(pid)
    return found


def kill_pids(pids: dict[int, str], what: str, grace_s: float = 10.0) -> list[str]:
    """SIGTERM, then SIGKILL, the given processes (ours, by id); names of those that had to be killed."""
    alive = {pid: name for pid, name in pids.items() if _alive(pid)}
    for pid in alive:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in alive):
        time.sleep(0.1)
    killed = []
    for pid, name in alive.items():
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
            killed.append(f"{name}[{pid}]")
    if killed:
        log(f"{what}: killed left-over processes {', '.join(killed)}")
    return killed


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
        return state != b"Z"
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Monitor:
    """Samples, once a second, how busy the machine is and how much of that is this run's own
    process tree (the load generator, the servers, Ray's daemons): the rest is other people's
    load, reported per phase, since a load average mixes both."""

    def __init__(self, interval_s: float = 1.0):
        import threading

        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float]] = []  # (time, busy cores, our cores)
        self.phases: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _busy_ticks() -> float:
        with open("/proc/stat") as handle:
            fields = [float(x) for x in handle.readline().split()[1:]]
        return sum(fields) - fields[3] - fields[4]  # all but idle and iowait

    @staticmethod
    def _our_ticks() -> dict[int, float]:
        out = {}
        for pid in [os.getpid(), *descendants(os.getpid())]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[pid] = float(fields[11]) + float(fields[12])
            except (OSError, IndexError):
                pass
        return out

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        busy, ours, last = self._busy_ticks(), self._our_ticks(), time.monotonic()
        while not self._stop.wait(self.interval_s):
            busy2, ours2, now = self._busy_ticks(), self._our_ticks(), time.monotonic()
            ours_delta = sum(max(0.0, v - ours[pid]) for pid, v in ours2.items() if pid in ours)
            elapsed = (now - last) * tick
            self.samples.append((now, (busy2 - busy) / elapsed, ours_delta / elapsed))
            busy, ours, last = busy2, ours2, now

    @contextmanager
    def phase(self, name: str):
        phase = {"when": name, "load": load_average(), "start": time.monotonic()}
        try:
            yield
        finally:
            phase["end"] = time.monotonic()
            self.phases.append(phase)

    def summary(self) -> list[dict]:
        out = []
        for phase in self.phases:
            inside = [x for x in self.samples if phase["start"] <= x[0] <= phase["end"]]
            busy = sum(x[1] for x in inside) / len(inside) if inside else float("nan")
            ours = sum(x[2] for x in inside) / len(inside) if inside else float("nan")
            out.append({"when": phase["when"], "load": phase["load"], "seconds": round(phase["end"] - phase["start"], 1),
                        "busy_cores": round(busy, 2), "our_cores": round(ours, 2),
                        "other_cores": round(max(0.0, busy - ours), 2)})
        return out


def bench_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    tree = [] if product_root == ROOT else [str(product_root / p) for p in ("", "replica", "router", "operator", "launcher")]
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *tree, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ModelplexStack:
    """``modelplex local MANIFEST`` as a process group; stopped with all its children."""

    def __init__(self, workdir: Path, name: str, spec: dict, env: dict[str, str], *, log_level: str = "warning"):
        self.workdir, self.name, self.log_level = workdir, name, log_level
        self.group = groups_for(MPX)
        self.manifest = workdir / f"{name}.yaml"
        self.manifest.write_text(json.dumps({
            "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
            "metadata": {"name": name}, "spec": {"image": "local", **spec}}))
        self.replicas = spec.get("replicas", 1)
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / f"{name}.log"

    def __enter__(self) -> ModelplexStack:
        argv = [sys.executable, "-m", cli_module(), "--log-level", self.log_level, "local", str(self.manifest),
                "--port", str(self.port)]
        if self.group is not None:
            argv = self.group.wrap(argv)
        # The working directory comes first on `python -m`'s path: it picks the checkout that runs.
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=str(product_root), start_new_session=True)
        try:
            asyncio.run(self._wait_ready())
        except BaseException:
            self.__exit__()
            raise
        return self

    async def _wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"modelplex local exited ({self.proc.returncode}); see {self.log_path}:\n"
                                       + self.log_path.read_text()[-3000:])
                try:
                    async with session.get(self.url + "/readyz") as resp:
                        if resp.status == 200 and (await resp.json())["ready_replicas"] >= self.replicas:
                            return
                except (aiohttp.ClientError, ValueError):
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"modelplex local not ready after {timeout:.0f} s; see {self.log_path}")

    def control_url(self) -> str:
        """Where the router's metrics are: its control port, which the ready line names (a tree
        from before the control port: the router's own URL)."""
        # The log is appended to by every run of the same name in a folder: the last line is this one's.
        found = re.findall(r"  control (\S+:\d+)", self.log_path.read_text(errors="replace"))
        return f"http://{found[-1]}" if found else self.url

    def replica_headers(self) -> dict[str, str]:
        """What a caller outside the router sends a replica of this stack: its deployment's
        internal credential (replicas refuse their API without it), from the file the ready
        output names; none where it names none (a tree from before per-deployment credentials)."""
        found = re.findall(r"deployment credentials: (\S+)/<name>", self.log_path.read_text(errors="replace"))
        if not found:
            return {}
        return {"X-Modelplex-Internal-Token": (Path(found[-1]) / self.name).read_text().strip()}

    def replicas_table(self) -> list[dict]:
        async def get() -> list[dict]:
            async with aiohttp.ClientSession() as session:
                async with session.get(self.url + "/v1/replicas") as resp:
                    return (await resp.json())["replicas"]
        return asyncio.run(get())

    def pids(self) -> dict[int, str]:
        """The supervisor, the router and the replicas: process id -> role."""
        out = {}
        if self.proc is not None:
            out[self.proc.pid] = "supervisor"
            for pid, name in descendants(self.proc.pid).items():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                role = "router" if b"router" in cmdline else "replica" if b"replica" in cmdline else name
                out[pid] = role
        return out

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        children = descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the supervisor stops its children in order
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        kill_pids({self.proc.pid: "modelplex local", **children}, "modelplex")
        self.proc.wait()
        self.proc = None


class RayStack:
    """``ray_app.py``: a local Ray with Serve's HTTP proxy, driven by JSON lines on stdin."""

    def __init__(self, workdir: Path, env: dict[str, str], *, num_gpus: int | None = None,
                 results: dict | None = None):
        self.workdir = workdir
        self.results = results
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.num_gpus = num_gpus
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / "ray.log"
        self.seen: dict[int, str] = {}
        self.version = ""
        self.start_s = 0.0
        self.group = groups_for(RAY)

    def __enter__(self) -> RayStack:
        argv = [sys.executable, str(HERE / "ray_app.py"), "--port", str(self.port), "--num-cpus", "2"]
        if self.num_gpus:
            argv += ["--num-gpus", str(self.num_gpus)]
        if self.group is not None:
            argv = self.group.wrap(argv)
        with self.log_path.open("ab") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env=self.env, cwd=str(HERE), start_new_session=True, text=True)
        try:
            started = self._answer(timeout=180)
            self.version, self.start_s = started.get("ray", ""), started.get("seconds", 0.0)
            if self.results is not None:
                self.results["ray_start_s"].append(self.start_s)
        except BaseException:
            self.__exit__()
            raise
        self.seen = descendants(self.proc.pid)
        return self

    def _answer(self, timeout: float) -> dict:
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                line = self.proc.stdout.readline()
                if not line:
                    break
                answer = json.loads(line)
                if not answer.get("ok"):
                    raise RuntimeError(f"ray_app: {answer}")
                return answer
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"ray_app did not answer in {timeout:.0f} s; see {self.log_path}:\n"
                           + self.log_path.read_text(errors="replace")[-3000:])

    def command(self, timeout: float = 300, **fields) -> dict:
        self.proc.stdin.write(json.dumps(fields) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(timeout)
        self.seen.update(descendants(self.proc.pid))
        return answer

    def deploy(self, workload: str, options: dict, env: dict[str, str] | None = None) -> float:
        return self.command(op="deploy", workload=workload, options=options, env=env or {})["seconds"]

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        self.seen.update(descendants(self.proc.pid))
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            log("ray_app did not quit in 60 s; stopping it")
        # serve.shutdown() + ray.shutdown() stop Ray's processes; whatever we saw and is
        # still there (raylet, gcs_server, workers) is stopped by id.
        leftovers = {pid: name for pid, name in self.seen.items() if _alive(pid)}
        leftovers.update(descendants(self.proc.pid))
        kill_pids({self.proc.pid: "ray_app", **leftovers}, "ray", grace_s=5)
        self.proc.wait()
        self.proc = None
        remaining = [f"{n}[{p}]" for p, n in self.seen.items() if _alive(p)]
        if remaining:
            log(f"WARNING: Ray processes still alive: {remaining}")


# -- workloads ---------------------------------------------------------------------------------


@dataclass
class Settings:
    quick: bool
    seconds: float
    warmup_s: float
    concurrency: list[int]
    rounds: int
    mux_requests: int
    mux_concurrency: int
    mux_max_seconds: float
    stream_concurrency: list[int]
    stream_seconds: float
    overhead_pairs: int
    gpu_concurrency: list[int]
    busy_seconds: float
    busy_stream_concurrency: list[int]
    busy_concurrency: list[int]
    #: Workload 1's batched mode over gRPC too (Modelplex only; ``results["batching_grpc"]``).
    grpc: bool = False


def compute_bound(sizes, batch_sizes: list[int], device: str = "cpu", seconds: float = 1.0) -> dict[int, dict]:
    """Forward passes per second of the bare model at each batch size, in this process, one
    intra-op thread (as in the replicas)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = make_mlp(sizes, seed=0, device=device)
    out = {}
    try:
        with torch.inference_mode():
            for size in batch_sizes:
                x = torch.randn(size, sizes[0], device=device)
                for _ in range(3):
                    model(x)
                if device != "cpu":
                    torch.cuda.synchronize()
                count, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds:
                    model(x)
                    count += 1
                if device != "cpu":
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - started
                out[size] = {"passes_per_s": count / elapsed, "rows_per_s": count * size / elapsed,
                             "ms_per_pass": elapsed / count * 1000}
    finally:
        torch.set_num_threads(threads)
    return out


def mlp_body(width: int) -> dict:
    rng = random.Random(7)
    return {"inputs": [round(rng.uniform(-1, 1), 4) for _ in range(width)]}


def run_batching(settings: Settings, workdir: Path, results: dict) -> None:
    """Workload 1: unbatched and batched, each concurrency, both systems, alternating."""
    body = mlp_body(MLP_SIZES[0])
    max_ongoing = max(128, 2 * max(settings.concurrency))
    modes = (("unbatched", "MLP"), ("batched", "BatchedMLP"))
    points: dict[str, dict[str, dict[int, list[loadgen.Point]]]] = {
        system: {mode: {c: [] for c in settings.concurrency} for mode, _ in modes} for system in (RAY, MPX)}
    order = [RAY, MPX]
    for round_index in range(settings.rounds):
        for system in order:
            with results["monitor"].phase(f"batching round {round_index + 1}, {system}"):
                _batching_phase(system, modes, max_ongoing, body, settings, workdir, results, points)
        order.reverse()  # Ray, Modelplex, Modelplex, Ray, ...
    results["batching"] = {
        system: {mode: {str(c): _merge(p).summary() for c, p in by_c.items()} for mode, by_c in by_mode.items()}
        for system, by_mode in points.items()}
    results["batching_latencies"] = {
        system: {mode: {str(c): _merge(p).latencies for c, p in by_c.items()} for mode, by_c in by_mode.items()}
        for system, by_mode in points.items()}


def _batching_phase(system, modes, max_ongoing, body, settings, workdir, results, points) -> None:
    if system == RAY:
        with RayStack(workdir, bench_env(), results=results) as ray:
            for mode, cls in modes:
                ray.deploy(cls, {"num_replicas": 1, "max_ongoing_requests": max_ongoing,
                                 "ray_actor_options": {"num_cpus": 1}})
                _sweep(system, mode, ray.url, body, settings, points)
    else:
        for mode, cls in modes:
            spec = {"replicas": 1, "handler": f"mp_handlers:{cls}", "maxOngoingRequests": max_ongoing}
            grpc_port = free_port()
            if settings.grpc:
                spec["router"] = {"grpcPort": grpc_port}
            with ModelplexStack(workdir, f"mlp-{mode}", spec, bench_env()) as stack:
                _sweep(system, mode, stack.url, body, settings, points)
                if settings.grpc and mode == "batched":
                    _sweep_grpc(f"127.0.0.1:{grpc_port}", body, settings, results)


def _sweep_grpc(address: str, body: dict, settings: Settings, results: dict) -> None:
    """The batched mode over gRPC beside its REST sweep: the same stack, rows and concurrencies."""
    sweeps = results.setdefault("batching_grpc", {})
    for c in settings.concurrency:
        point = asyncio.run(loadgen.unary_grpc(address, "mlp", body["inputs"], c, settings.seconds,
                                               warmup_s=settings.warmup_s))
        s = point.summary()
        log(f"batching {MPX:9s} {'gRPC':9s} c={c:<3d} {s['rps']:8.1f} req/s  p50 {s['p50_ms']:7.2f} ms  "
            f"p99 {s['p99_ms']:7.2f} ms  errors {s['errors']}")
        sweeps.setdefault(str(c), []).append(s)


def _sweep(system: str, mode: str, url: str, body: dict, settings: Settings, points) -> None:
    for c in settings.concurrency:
        point = asyncio.run(loadgen.unary(url, body, c, settings.seconds, warmup_s=settings.warmup_s))
        s = point.summary()
        log(f"batching {system:9s} {mode:9s} c={c:<3d} {s['rps']:8.1f} req/s  p50 {s['p50_ms']:7.2f} ms  "
            f"p99 {s['p99_ms']:7.2f} ms  errors {s['errors']}")
        points[system][mode][c].append(point)


def _merge(points: list[loadgen.Point]) -> loadgen.Point:
    merged = loadgen.Point(points[0].concurrency)
    for p in points:
        merged.seconds += p.seconds
        merged.ok += p.ok
        merged.errors += p.errors
        for k, v in p.error_kinds.items():
            merged.error_kinds[k] = merged.error_kinds.get(k, 0) + v
        merged.latencies += p.latencies
        merged.ttfc += p.ttfc
        merged.chunks += p.chunks
    return merged


MUX = {"replicas": 2, "models": 40, "zipf": 1.1, "fetch_s": 0.1, "max_ongoing": 16}


def mux_trace(settings: Settings) -> list[str]:
    return belady.zipf_trace(settings.mux_requests, MUX["models"], MUX["zipf"], seed=0)


def run_multiplexing(settings: Settings, workdir: Path, results: dict) -> None:
    """Workload 2: the same Zipf trace on each system, fresh (empty) caches each time."""
    trace = mux_trace(settings)
    slots = MUX["replicas"] * MUX_SLOTS
    out = {"requests": len(trace), "models": MUX["models"], "zipf": MUX["zipf"], "replicas": MUX["replicas"],
           "slots": MUX_SLOTS, "fetch_s": MUX["fetch_s"], "concurrency": settings.mux_concurrency,
           "max_ongoing": MUX["max_ongoing"], "distinct_in_trace": len(set(trace)),
           "offline": {
               "belady_global_8": belady.belady_hits(trace, slots) / len(trace),
               "lru_global_8": belady.lru_hits(trace, slots) / len(trace),
               "belady_one_replica_4": belady.belady_hits(trace, MUX_SLOTS) / len(trace),
               "static_top_8": _static_top(trace, slots),
           }, "systems": {}}
    for system in (MPX, RAY):
        with results["monitor"].phase(f"multiplexing, {system}"):
            if system == RAY:
                entry = mux_ray(settings, workdir, trace, results)
            else:
                entry = mux_modelplex(settings, workdir, trace)
        out["systems"][system] = entry
        log(f"multiplexing {system:9s} {entry['ok']}/{len(trace)} ok  hit rate {entry['hit_rate']:.3f}  "
            f"loads {entry['loads']}  {entry['rps']:.1f} req/s  p50 {entry['p50_ms']:.1f} ms  p99 {entry['p99_ms']:.1f} ms"
            f"  loads in flight per replica: mean {entry['loads_in_flight_mean']:.2f}, max {entry['loads_in_flight_max']}")
    results["multiplexing"] = out


def _mux_env(workdir: Path, name: str) -> tuple[Path, dict[str, str]]:
    load_log = workdir / f"loads-{name}.txt"
    load_log.unlink(missing_ok=True)
    return load_log, {"BENCH_LOAD_LOG": str(load_log), "BENCH_FETCH_S": str(MUX["fetch_s"])}


def mux_body() -> dict:
    return {"inputs": mlp_body(MUX_SIZES[0])["inputs"]}


def mux_ray(settings: Settings, workdir: Path, trace: list[str], results: dict) -> dict:
    load_log, env = _mux_env(workdir, "ray")
    body = mux_body()
    with RayStack(workdir, bench_env(), results=results) as ray:
        ray.deploy("Multiplexed", {"num_replicas": MUX["replicas"], "max_ongoing_requests": MUX["max_ongoing"],
                                   "ray_actor_options": {"num_cpus": 1}}, env)
        point = asyncio.run(loadgen.trace(ray.url, trace, body, settings.mux_concurrency,
                                          max_seconds=settings.mux_max_seconds))
        entry = _trace_entry(point, load_log, trace)
        # Concurrency 1 on a loaded model: Ray's end-to-end latency (no way around its proxy).
        c1 = asyncio.run(loadgen.paired(ray.url + "/", ray.url + "/", body, {loadgen.MODEL_ID_HEADER: "model-01"},
                                        settings.overhead_pairs // 2))
        entry["c1_ms"] = {"p50": loadgen.pct(c1[0] + c1[1], 0.5), "p99": loadgen.pct(c1[0] + c1[1], 0.99)}
    entry["trace_latencies"] = point.latencies
    return entry


def mux_modelplex(settings: Settings, workdir: Path, trace: list[str], *, extra_env: dict[str, str] | None = None,
                  overhead: bool = True, multiplexing: dict | None = None) -> dict:
    """``multiplexing``: the spec's cache fields (e.g. ``{"evictionPolicy": "lfu"}``)."""
    load_log, env = _mux_env(workdir, "modelplex")
    env.update(extra_env or {})
    body = mux_body()
    spec = {"replicas": MUX["replicas"], "handler": "mp_handlers:Multiplexed", "maxOngoingRequests": MUX["max_ongoing"]}
    if multiplexing:
        spec["multiplexing"] = multiplexing
    with ModelplexStack(workdir, "mux", spec, bench_env(env)) as stack:
        point = asyncio.run(loadgen.trace(stack.url, trace, body, settings.mux_concurrency,
                                          max_seconds=settings.mux_max_seconds))
        entry = _trace_entry(point, load_log, trace)
        table = stack.replicas_table()
        entry["counters"] = asyncio.run(_modelplex_counters(stack.control_url(), [r["url"] for r in table]))
        if overhead:
            entry["overhead"] = _router_overhead(stack, body, settings.overhead_pairs)
    entry["trace_latencies"] = point.latencies
    return entry


def _static_top(trace: list[str], k: int) -> float:
    from collections import Counter

    top = {m for m, _ in Counter(trace).most_common(k)}
    return sum(m in top for m in trace) / len(trace)


def _trace_entry(point: loadgen.Point, load_log: Path, trace: list[str]) -> dict:
    lines = load_log.read_text().splitlines() if load_log.exists() else []
    loads = len(lines)
    load_seconds = sorted(float(line.split()[3]) for line in lines)
    sent = getattr(point, "sent", point.ok)
    s = point.summary()
    mean_inflight, max_inflight = _loads_in_flight(lines)
    from collections import Counter

    top4 = {m for m, _ in Counter(trace).most_common(4)}
    return {"sent": sent, "ok": point.ok, "errors": point.errors, "error_kinds": point.error_kinds,
            "loads": loads, "hit_rate": 1 - loads / sent if sent else float("nan"),
            "load_p50_ms": loadgen.pct(load_seconds, 0.5), "per_replica_loads": _per_pid(lines),
            "loads_in_flight_mean": mean_inflight, "loads_in_flight_max": max_inflight,
            "top4_loads": sum(1 for line in lines if line.split()[1] in top4),
            "seconds": s["seconds"], "rps": s["rps"], "p50_ms": s["p50_ms"], "p90_ms": s["p90_ms"],
            "p99_ms": s["p99_ms"]}


def _loads_in_flight(lines: list[str]) -> tuple[float, int]:
    """Per replica (process), loads running at once: time-weighted mean over the time any load
    ran, and the maximum (from each load's end time and duration)."""
    by_pid: dict[str, list[tuple[float, int]]] = {}
    for line in lines:
        pid, _, end, seconds = line.split()
        events = by_pid.setdefault(pid, [])
        events += [(float(end) - float(seconds), 1), (float(end), -1)]
    weighted = busy = 0.0
    peak = 0
    for events in by_pid.values():
        events.sort()
        level, last = 0, events[0][0]
        for t, step in events:
            if level:
                weighted += level * (t - last)
                busy += t - last
            level += step
            last = t
            peak = max(peak, level)
    return (weighted / busy if busy else 0.0), peak


def _per_pid(lines: list[str]) -> list[int]:
    from collections import Counter

    return sorted(Counter(line.split()[0] for line in lines).values(), reverse=True)


async def _modelplex_counters(router: str, replicas: list[str]) -> dict:
    async with aiohttp.ClientSession() as session:
        async def metric(url: str, name: str) -> float:
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(name + "{") or line.startswith(name + " "))
        return {
            "model_loads_total": sum([await metric(u, "modelplex_model_loads_total") for u in replicas]),
            "model_evictions_total": sum([await metric(u, "modelplex_model_evictions_total") for u in replicas]),
            "router_cache_hits_total": await metric(router, "modelplex_router_cache_hits_total"),
            "router_cache_misses_total": await metric(router, "modelplex_router_cache_misses_total"),
            "router_fallbacks_total": await metric(router, "modelplex_router_fallbacks_total"),
        }


def _router_overhead(stack: ModelplexStack, body: dict, pairs: int) -> dict:
    """Concurrency 1, a loaded model: straight to the replica holding it vs through the router,
    interleaved request by request; the paired difference is what the router adds."""
    model = "model-01"
    holder = next((r for r in stack.replicas_table() if model in r["models"]), None)
    if holder is None:
        return {}
    direct, routed = asyncio.run(loadgen.paired(holder["url"] + "/v1/invoke", stack.url + "/", body,
                                                {loadgen.MODEL_ID_HEADER: model}, pairs,
                                                headers_a=stack.replica_headers()))
    diffs = [r - d for r, d in zip(routed, direct)]
    return {"pairs": pairs,
            "direct_p50": loadgen.pct(direct, 0.5), "direct_p99": loadgen.pct(direct, 0.99),
            "router_p50": loadgen.pct(routed, 0.5), "router_p99": loadgen.pct(routed, 0.99),
            "diff_p50": loadgen.pct(diffs, 0.5), "diff_p99": loadgen.pct(diffs, 0.99)}


def run_streaming(settings: Settings, workdir: Path, results: dict) -> None:
    """Workload 3: 20-chunk streams, 10 ms apart, 2 replicas, rising concurrency."""
    replicas, interval_s = 2, 0.01
    max_ongoing = max(settings.stream_concurrency)
    body = {"chunks": STREAM_CHUNKS}
    env = {"BENCH_STREAM_INTERVAL_S": str(interval_s)}
    out = {"chunks": STREAM_CHUNKS, "interval_s": interval_s, "replicas": replicas,
           "max_ongoing": max_ongoing, "systems": {}, "ttfc": {}}
    for system in (RAY, MPX):
        by_c, ttfc = {}, {}
        with results["monitor"].phase(f"streaming, {system}"):
            if system == RAY:
                with RayStack(workdir, bench_env(), results=results) as ray:
                    ray.deploy("Streamer", {"num_replicas": replicas, "max_ongoing_requests": max_ongoing,
                                            "ray_actor_options": {"num_cpus": 1}}, env)
                    _stream_sweep(system, ray.url, body, settings, by_c, ttfc)
            else:
                spec = {"replicas": replicas, "handler": "mp_handlers:Streamer", "maxOngoingRequests": max_ongoing}
                with ModelplexStack(workdir, "stream", spec, bench_env(env)) as stack:
                    _stream_sweep(system, stack.url, body, settings, by_c, ttfc)
        out["systems"][system] = by_c
        out["ttfc"][system] = ttfc
    results["streaming"] = out


def _stream_sweep(system: str, url: str, body: dict, settings: Settings, by_c: dict, ttfc: dict) -> None:
    for c in settings.stream_concurrency:
        point = asyncio.run(loadgen.streams(url, body, STREAM_CHUNKS, c, settings.stream_seconds,
                                            warmup_s=settings.warmup_s))
        s = point.summary()
        by_c[str(c)] = s
        ttfc[str(c)] = point.ttfc
        log(f"streaming {system:9s} c={c:<3d} {s['rps']:7.1f} streams/s  {s.get('chunks_per_s', 0):8.0f} chunks/s  "
            f"ttfc p50 {s.get('ttfc_p50_ms', float('nan')):7.2f} p99 {s.get('ttfc_p99_ms', float('nan')):7.2f} ms  "
            f"errors {s['errors']} {s['error_kinds'] or ''}")


def run_gpu(settings: Settings, workdir: Path, results: dict, device: str, sizes: tuple[int, ...]) -> None:
    """GPU variant of workload 1: a larger MLP on ``device``, batches of up to 256."""
    body = mlp_body(sizes[0])
    batch_sizes = sorted({1, 8, 32, 64, 128, GPU_BATCH_MAX})
    bound = compute_bound(sizes, batch_sizes, device=device)
    env = {"BENCH_DEVICE": device, "BENCH_GPU_SIZES": ",".join(map(str, sizes))}
    max_ongoing = max(2 * max(settings.gpu_concurrency), 2 * GPU_BATCH_MAX)
    out = {"device": device, "sizes": list(sizes), "compute_bound": {str(k): v for k, v in bound.items()}, "systems": {}}
    for system in (RAY, MPX):
        by_c = {}
        with results["monitor"].phase(f"gpu, {system}"):
            if system == RAY:
                gpus = 1 if device.startswith("cuda") else None
                with RayStack(workdir, bench_env(), num_gpus=gpus, results=results) as ray:
                    actor = {"num_cpus": 1, **({"num_gpus": 1} if gpus else {})}
                    ray.deploy("GPUBatchedMLP", {"num_replicas": 1, "max_ongoing_requests": max_ongoing,
                                                 "ray_actor_options": actor}, env)
                    _gpu_sweep(system, ray.url, body, settings, by_c)
            else:
                spec = {"replicas": 1, "handler": "mp_handlers:GPUBatchedMLP", "maxOngoingRequests": max_ongoing}
                with ModelplexStack(workdir, "gpu", spec, bench_env(env)) as stack:
                    _gpu_sweep(system, stack.url, body, settings, by_c)
        out["systems"][system] = by_c
    results["gpu"] = out


def _gpu_sweep(system: str, url: str, body: dict, settings: Settings, by_c: dict) -> None:
    for c in settings.gpu_concurrency:
        point = asyncio.run(loadgen.unary(url, body, c, settings.seconds, warmup_s=settings.warmup_s))
        by_c[str(c)] = s = point.summary()
        log(f"gpu {system:9s} c={c:<3d} {s['rps']:8.1f} req/s  p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms  "
            f"errors {s['errors']}")


def _cpu_seconds(pids) -> float:
    """CPU time (user + system) the given processes have used so far."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


BUSY = {"replicas": 1, "max_ongoing": 32, "rows": BUSY_ROWS, "chunks": BUSY_CHUNKS}
BUSY_MODES = (("stream", "BusyStreamer"), ("unary", "BusyMLP"))


def run_busy(settings: Settings, workdir: Path, results: dict) -> None:
    """Workload 4 (issue 10): handlers that compute on their event loop, one replica, both
    systems, in alternating rounds; the points of each (mode, concurrency) are pooled."""
    body = mlp_body(MLP_SIZES[0])
    bound = compute_bound(MLP_SIZES, [BUSY_ROWS])[BUSY_ROWS]
    log(f"busy: compute bound {bound['passes_per_s']:.0f} passes/s of {BUSY_ROWS} rows "
        f"({bound['ms_per_pass']:.1f} ms each) = {bound['passes_per_s'] / BUSY_CHUNKS:.1f} streams/s")
    points: dict = {system: {mode: {c: [] for c in _busy_levels(settings, mode)} for mode, _ in BUSY_MODES}
                    for system in (RAY, MPX)}
    health: dict = {mode: {c: {"readyz": [], "readyz_failed": 0, "not_ready": 0} for c in _busy_levels(settings, mode)}
                    for mode, _ in BUSY_MODES}
    order = [RAY, MPX]
    for round_index in range(settings.rounds):
        for system in order:
            with results["monitor"].phase(f"busy round {round_index + 1}, {system}"):
                if system == RAY:
                    with RayStack(workdir, bench_env(), results=results) as ray:
                        for mode, cls in BUSY_MODES:
                            ray.deploy(cls, {"num_replicas": BUSY["replicas"], "max_ongoing_requests": BUSY["max_ongoing"],
                                             "ray_actor_options": {"num_cpus": 1}})
                            _busy_sweep(system, mode, ray.url, body, settings, points, None, None,
                                        lambda: {**ray.seen, **descendants(ray.proc.pid)})
                else:
                    for mode, cls in BUSY_MODES:
                        spec = {"replicas": BUSY["replicas"], "handler": f"mp_handlers:{cls}",
                                "maxOngoingRequests": BUSY["max_ongoing"]}
                        # info: the router logs each replica's "ready" / "not ready" transition.
                        with ModelplexStack(workdir, f"busy-{mode}-{round_index}", spec, bench_env(),
                                            log_level="info") as stack:
                            _busy_sweep(system, mode, stack.url, body, settings, points, stack, health, stack.pids)
        order.reverse()
    results["busy"] = {
        **BUSY, "seconds": settings.busy_seconds, "rounds": settings.rounds, "compute_bound": bound,
        "systems": {system: {mode: {str(c): _busy_summary(p) for c, p in by_c.items()}
                             for mode, by_c in by_mode.items()} for system, by_mode in points.items()},
        "modelplex_health": {mode: {str(c): {"readyz_p50_ms": loadgen.pct(h["readyz"], 0.5),
                                             "readyz_p99_ms": loadgen.pct(h["readyz"], 0.99),
                                             "readyz_max_ms": max(h["readyz"], default=float("nan")) * 1000,
                                             "readyz_probes": len(h["readyz"]), "readyz_failed": h["readyz_failed"],
                                             "not_ready_transitions": h["not_ready"]}
                                    for c, h in by_c.items()} for mode, by_c in health.items()}}


def _busy_summary(points: list[loadgen.Point]) -> dict:
    merged = _merge(points)
    cpu = sum(p.server_cpu_s for p in points)
    return {**merged.summary(), "server_cores": round(cpu / merged.seconds, 3) if merged.seconds else None,
            "server_cpu_ms_per_answer": round(cpu / merged.ok * 1000, 2) if merged.ok else None}


def _busy_levels(settings: Settings, mode: str) -> list[int]:
    return settings.busy_stream_concurrency if mode == "stream" else settings.busy_concurrency


def _busy_sweep(system, mode, url, body, settings, points, stack, health, server_pids) -> None:
    replica = stack.replicas_table()[0]["url"] if stack else None
    for c in _busy_levels(settings, mode):
        log_start = stack.log_path.stat().st_size if stack else 0
        if mode == "stream":
            load = loadgen.streams(url, body, BUSY_CHUNKS, c, settings.busy_seconds, warmup_s=settings.warmup_s)
        else:
            load = loadgen.unary(url, body, c, settings.busy_seconds, warmup_s=settings.warmup_s)
        pids = server_pids()
        cpu, wall = _cpu_seconds(pids), time.perf_counter()
        point, probes, failed = asyncio.run(loadgen.with_probe(load, replica + "/readyz" if replica else None))
        # The servers' CPU per answer: on a machine that others load, what a point costs does not
        # depend on the share of the cores it got, as its throughput does.
        point.server_cpu_s = (_cpu_seconds(pids) - cpu) / (time.perf_counter() - wall) * point.seconds
        points[system][mode][c].append(point)
        s = point.summary()
        extra = ""
        if stack:
            with stack.log_path.open("rb") as handle:
                handle.seek(log_start)
                not_ready = handle.read().count(b"is not ready")
            h = health[mode][c]
            h["readyz"] += probes
            h["readyz_failed"] += failed
            h["not_ready"] += not_ready
            extra = (f"  replica /readyz p99 {loadgen.pct(probes, 0.99):.1f} ms ({failed} failed), "
                     f"router 'not ready' lines {not_ready}")
        ttfc = f"  ttfc p50 {s['ttfc_p50_ms']:7.1f} p99 {s['ttfc_p99_ms']:7.1f} ms" if "ttfc_p50_ms" in s else ""
        per = point.server_cpu_s / point.ok * 1000 if point.ok else float("nan")
        log(f"busy {system:9s} {mode:6s} c={c:<3d} {s['rps']:7.1f}/s  p50 {s['p50_ms']:7.1f} p99 {s['p99_ms']:7.1f} ms"
            f"{ttfc}  errors {s['errors']} {s['error_kinds'] or ''}  servers {point.server_cpu_s / point.seconds:.2f} "
            f"cores, {per:.0f} ms CPU per answer{extra}")


# -- environment -------------------------------------------------------------------------------


def wait_for_quiet(threshold: float, max_wait_s: float) -> dict:
    started = time.monotonic()
    first = load_average()
    while load_average()[0] >= threshold and time.monotonic() - started < max_wait_s:
        log(f"load average {load_average()[0]:.2f} >= {threshold}: waiting (up to {max_wait_s:.0f} s)")
        time.sleep(20)
    return {"before_wait": first, "after_wait": load_average(), "waited_s": round(time.monotonic() - started, 1)}


def environment() -> dict:
    import torch

    def version(module: str) -> str:
        try:
            from importlib.metadata import version as v

            return v(module)
        except Exception:  # noqa: BLE001
            return "not installed"

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=product_root, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    dirty = [line for line in git("status", "--porcelain").splitlines() if not line[3:].startswith("bench/")]
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gb": round(mem_gb, 1), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "ray": version("ray"),
            "aiohttp": version("aiohttp"), "modelplex": version("modelplex"),
            "commit": git("rev-parse", "--short", "HEAD"), "commit_subject": git("log", "-1", "--format=%s"),
            "tree": None if product_root == ROOT else str(product_root),
            "tree_dirty_outside_bench": len(dirty),
            "cuda": torch.cuda.is_available(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# -- main --------------------------------------------------------------------------------------


def settings_for(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings(quick=True, seconds=3.0, warmup_s=0.5, concurrency=[1, 8, 32, 64], rounds=1,
                        mux_requests=400, mux_concurrency=16, mux_max_seconds=60, stream_concurrency=[1, 8, 64, 256],
                        stream_seconds=3.0, overhead_pairs=200, gpu_concurrency=[1, 64, 256],
                        busy_seconds=3.0, busy_stream_concurrency=[8], busy_concurrency=[1, 32])
    return Settings(quick=False, seconds=args.seconds, warmup_s=1.0, concurrency=[1, 8, 32, 64], rounds=args.rounds,
                    mux_requests=2000, mux_concurrency=16, mux_max_seconds=240,
                    stream_concurrency=[1, 8, 32, 64, 128, 256], stream_seconds=args.seconds, overhead_pairs=500,
                    gpu_concurrency=[1, 16, 64, 256], busy_seconds=max(args.seconds, 10.0),
                    busy_stream_concurrency=[1, 8, 16], busy_concurrency=[1, 8, 32])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short points, one round, fewer requests (~4 min)")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results, or bench/results/quick)")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per point (full run)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of workload 1 (full run)")
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--tree", type=Path, default=None,
                        help="run Modelplex from this checkout (e.g. a `git worktree`) instead of this one")
    parser.add_argument("--wait-load", type=float, default=None, metavar="LOAD",
                        help="first wait (up to --max-wait s) until the 1-minute load average is below LOAD "
                             "(default: 1.0 for the full run, no wait for --quick)")
    parser.add_argument("--max-wait", type=float, default=600.0)
    parser.add_argument("--grpc", action="store_true",
                        help="also sweep workload 1's batched mode over Modelplex's gRPC (results: batching_grpc)")
    parser.add_argument("--cpus", type=float, default=1.0,
                        help="run each system in a cgroup of its own with this CPU quota, the same for both, so "
                             "that other people's load does not decide the comparison (0: no groups)")
    parser.add_argument("--shared-cpus", type=int, default=0, metavar="N",
                        help="a small machine on any machine: the load generator and both systems share one "
                             "cgroup of N CPUs (quota and cpuset), as on an N-core machine (overrides --cpus)")
    parser.add_argument("--gpu-device", default=None, help=argparse.SUPPRESS)  # e.g. cpu: smoke-test the GPU path
    args = parser.parse_args(argv)
    global product_root, cpu_groups
    if args.tree is not None:
        product_root = args.tree.resolve()
        if not any((product_root / path).exists() for path in CLI_PATHS.values()):
            parser.error(f"--tree {args.tree}: not a Modelplex checkout (no {' or '.join(CLI_PATHS.values())})")
    settings = dataclasses.replace(settings_for(args), grpc=args.grpc)
    out_dir = args.out or (ROOT / "bench" / "results" / ("quick" if args.quick else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.quick and args.out is None:
        (out_dir / ".gitignore").write_text("# quick (smoke) runs are not results\n*\n")

    try:
        import ray  # noqa: F401
    except ImportError:
        print("bench/compare: Ray Serve is not installed; pip install 'ray[serve]' (the bench extra)", file=sys.stderr)
        return 2

    threshold = args.wait_load if args.wait_load is not None else (None if args.quick else 1.0)
    load_wait = wait_for_quiet(threshold, args.max_wait) if threshold is not None else None
    command = "python bench/compare/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results: dict = {"command": command.strip(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                     "environment": environment(), "load_wait": load_wait, "ray_start_s": [],
                     "settings": settings.__dict__, "sizes": {"mlp": MLP_SIZES, "mux": MUX_SIZES, "gpu": GPU_MLP_SIZES},
                     "batch": {"max_batch_size": BATCH_MAX, "batch_wait_timeout_s": BATCH_WAIT_S}}
    log(f"environment: {results['environment']}")
    started = time.monotonic()
    monitor = results["monitor"] = Monitor()
    groups = nullcontext()
    if args.cpus > 0 or args.shared_cpus:
        why_not = cgroups.available()
        if why_not:
            log(f"cpu groups: not used: {why_not}")
            results["cpu_groups"] = {"not_used": why_not}
        else:
            groups = cpu_groups = cgroups.Groups(args.shared_cpus or args.cpus, shared=bool(args.shared_cpus))
    with groups, monitor, tempfile.TemporaryDirectory(prefix="modelplex-compare-") as tmp:
        workdir = Path(tmp)
        if "batching" in args.workloads:
            bound = compute_bound(MLP_SIZES, [1, 8, 32, 64])
            results["compute_bound"] = {str(k): v for k, v in bound.items()}
            log("compute bound: " + ", ".join(f"batch {b}: {v['passes_per_s']:.0f} passes/s = {v['rows_per_s']:.0f} rows/s"
                                              for b, v in bound.items()))
            run_batching(settings, workdir, results)
        if "multiplexing" in args.workloads:
            run_multiplexing(settings, workdir, results)
        if "streaming" in args.workloads:
            run_streaming(settings, workdir, results)
        if "busy" in args.workloads:
            run_busy(settings, workdir, results)
        if "gpu" in args.workloads:
            import torch

            device = args.gpu_device or ("cuda" if torch.cuda.is_available() else None)
            if device is None:
                results["gpu"] = {"skipped": "skipped: no CUDA device"}
                log("gpu variant: skipped: no CUDA device")
            else:
                sizes = GPU_MLP_SIZES if device.startswith("cuda") else (64, 128, 64)
                try:
                    run_gpu(settings, workdir, results, device, sizes)
                except Exception as error:  # noqa: BLE001 - never fail the run on the optional variant
                    results["gpu"] = {"skipped": f"failed: {type(error).__name__}: {error}"}
                    log(f"gpu variant failed: {error}")
    results.pop("monitor")
    if cpu_groups is not None:
        results["cpu_groups"] = cpu_groups.describe()
        cpu_groups = None
    results["load"] = monitor.summary()
    results["load_end"] = load_average()
    results["wall_s"] = round(time.monotonic() - started, 1)
    report.write(results, out_dir)
    log(f"done in {results['wall_s']:.0f} s: {out_dir / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
