"""The scale harness: a real apiserver, a simulated replica fleet, the real router and operator.

    .venv/bin/python bench/scale/run.py --replicas 100 --models 1000 [--deployments 100] [--seconds 30]

One point per invocation (``--replicas 0`` skips the routing point, ``--deployments 0`` the
deployments point); one JSON line per point on stdout, progress on stderr. Not part of
``make test``. It starts, and stops by pid whatever happens:

- the project's control plane without a node (etcd, kube-apiserver, controller-manager,
  scheduler on 127.0.0.1: :class:`modelplex_cluster.controlplane.ControlPlane` with
  ``node=False``), from the binaries ``make test`` built and cached
  (``~/.cache/modelplex/control-plane``; ``MODELPLEX_CONTROL_PLANE_BIN`` names another folder);
- no kubelet: the harness registers one Node object and creates the replica pods bound to it,
  then sets each pod's status itself (Running, Ready, its pod IP 127.0.x.y), as kwok would;
- the simulated fleet (``fleet.py``): one process answering every replica on its pod IP, each
  with its own models, patching its own pod's loaded-models annotation (the replica's own
  coalescing reporter) as a Zipf trace of loads drives it;
- the real routers (``modelplex router``, two by default as a deployment runs them), each
  discovering the pods through one watch of that apiserver, with requests sent through the
  first during the window;
- for the deployments point, the real operator (``modelplex operator``) and
  ``--deployments`` MultiplexedDeployments applied at once.

Figures: ``decision_p50_us_hit`` / ``_miss`` (the router's policy over the routing table's
index at this size, in this process: ``bench/router/bench_decisions.py``), ``router_rss_mb``
(the router process after the window), ``discovery_p99_ms`` (a model loaded on a replica → the
router read the document that shows it: the fleet times each change to the router's next read of
that replica's ``GET /v1/models``; then ``routed_after_discovery`` checks, for a sample of fresh
loads, that once the first router's table shows the model a request for it goes to that replica),
``discovery_stages_ms`` (its profile: p50 and p99 of each step from a load to the router's read:
``coalesce`` the reporter's interval, ``queue`` the fleet's patch threads, ``write`` the
apiserver's answer, ``watch`` its delivery to a watch on the pods, ``router`` that delivery → the
router's read; ``read_before_watch`` counts changes a router read first through a response's
summary header), ``routers_agree`` (after the trace stops and the interval passes, the replicas whose models
all routers' tables agree on), ``apiserver_writes_per_s`` (the apiserver's own count of POST/PUT/PATCH/DELETE during the
window), ``request_p50_ms`` (requests through the router); ``reconcile_all_s`` (applying the
deployments → every one has its status written for its generation), ``operator_rss_mb``,
``operator_cpu_s`` (the operator's CPU time over that burst), ``operator_apiserver_calls`` (every client's calls in that time, the controller-manager's
included), ``operator_object_calls`` and ``_per_deployment`` (the calls on what only the operator
reads and writes: :data:`OPERATOR_RESOURCES`); the breakdown by verb and resource goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "router"))

import bench_decisions  # noqa: E402
import fleet as sim  # noqa: E402

from modelplex.processes import free_port, spawn, stop, wait_for  # noqa: E402
from modelplex.wire.loaded import summary_annotations  # noqa: E402
from modelplex.wire.names import (API_GROUP, API_VERSION, KIND, LABEL_DEPLOYMENT, LABEL_ROLE,  # noqa: E402
                                  MODEL_ID_HEADER, PLURAL, ROLE_REPLICA)
from modelplex_cluster.controlplane import ControlPlane, build_binaries  # noqa: E402

NAMESPACE = "scale"
DEPLOYMENT = "scale"
NODE = "scale-node"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
#: What only the operator reads and writes one by one (the controller-manager writes Deployments'
#: and budgets' status subresources, ReplicaSets, pods, and watches the rest): the calls on these
#: are the operator's (Events are left out: the controller-manager posts them too).
OPERATOR_RESOURCES = frozenset({
    "serviceaccounts", "roles", "rolebindings", "configmaps", "services", "networkpolicies", "deployments",
    "poddisruptionbudgets", "secrets", "multiplexeddeployments", "multiplexeddeployments/status"})


def say(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (less moved by other load than wall time)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 1)


class Cluster:
    """The control plane and a client of it."""

    def __init__(self, state: Path):
        from kubernetes import client, config

        self.cp = ControlPlane(build_binaries(quiet=True), state_dir=state / "cluster", node=False)
        self.cp.start()
        self.api_client = config.new_client_from_config(config_file=str(self.cp.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def requests_total(self, verbs: tuple[str, ...] | None) -> float:
        """The apiserver's ``apiserver_request_total`` summed over ``verbs`` (None: all)."""
        return sum(value for (verb, _), value in self.requests_by_kind().items() if verbs is None or verb in verbs)

    def requests_by_kind(self) -> Counter[tuple[str, str]]:
        """The apiserver's ``apiserver_request_total`` by (verb, resource[/subresource])."""
        response = self.api_client.call_api("/metrics", "GET", _preload_content=False, auth_settings=["BearerToken"])
        counts: Counter[tuple[str, str]] = Counter()
        for line in response.data.decode().splitlines():
            if line.startswith("apiserver_request_total{"):
                labels, value = line.rsplit(" ", 1)
                parsed = dict(part.split("=", 1) for part in labels[len("apiserver_request_total{"):-1].split(",")
                              if "=" in part)
                field = {key: raw.strip('"') for key, raw in parsed.items()}
                resource = field.get("resource", "") + (f"/{field['subresource']}" if field.get("subresource") else "")
                counts[field.get("verb", ""), resource] += float(value)
        return counts

    def namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name}})
        wait_for(lambda: self.core.read_namespaced_service_account("default", name), 60, 0.25,
                 f"the default ServiceAccount of {name}")

    def node(self) -> None:
        """One Node the simulated pods are bound to (no kubelet: its status is set here, once;
        the node-lifecycle controller is off in this control plane, so it stays Ready)."""
        self.core.create_node({"metadata": {"name": NODE, "labels": {"type": "simulated"}}})
        capacity = {"cpu": "10000", "memory": "10000Gi", "pods": "100000"}
        self.core.patch_node_status(NODE, {"status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Simulated", "message": "scale harness"}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}})

    def stop(self) -> None:
        self.cp.stop()


def create_pods(cluster: Cluster, replicas: int, models: int, capacity: int, port: int) -> None:
    """The replica pods, bound to the simulated node, Running and Ready on their 127.0.x.y."""
    def one(i: int) -> None:
        name = sim.pod_name(i)
        cluster.core.create_namespaced_pod(NAMESPACE, {
            "metadata": {"name": name, "labels": {LABEL_DEPLOYMENT: DEPLOYMENT, LABEL_ROLE: ROLE_REPLICA},
                         "annotations": summary_annotations(sim.initial_summary(i, models, capacity))},
            "spec": {"nodeName": NODE, "automountServiceAccountToken": False,
                     "containers": [{"name": "replica", "image": "modelplex-simulated",
                                     "ports": [{"name": "http", "containerPort": port}]}]}})
        ip = sim.address(i)
        cluster.core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"},
                           {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}]}})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(replicas)))


def manifest(folder: Path, capacity: int) -> Path:
    path = folder / "scale.json"
    path.write_text(json.dumps({
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND,
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
        "spec": {"image": "modelplex-simulated", "handler": "simulated:Model", "maxOngoingRequests": 8,
                 "multiplexing": {"maxModelsPerReplica": capacity}}}))
    return path


async def drive(router: str, control: str, seconds: float, rate: float, models: int, rng: random.Random) -> list[float]:
    """Requests through the router for ``seconds`` at ``rate`` a second (Zipf over the models);
    their latencies in ms."""
    weights = [1 / (k + 1) ** 1.1 for k in range(models)]
    latencies: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def one(model: str) -> None:
            started = time.perf_counter()
            async with session.post(router + "/", json={"inputs": [1]}, headers={MODEL_ID_HEADER: model}) as resp:
                await resp.read()
                if resp.status == 200:
                    latencies.append((time.perf_counter() - started) * 1000)

        tasks = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            model = sim.model_name(rng.choices(range(models), weights)[0])
            tasks.append(asyncio.create_task(one(model)))
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks, return_exceptions=True)
    return latencies


async def routed_after_discovery(router: str, control: str, replicas: int, samples: int, rng: random.Random) -> tuple[int, int]:
    """Load a fresh model on ``samples`` replicas; once the router's table shows each one (its
    ``/v1/replicas``), a request for it must go to that replica. Returns (went there, tried)."""
    ok = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for k in range(samples):
            i = rng.randrange(replicas)
            model = f"probe-{k}-{rng.randrange(10**9)}"
            async with session.post(f"{control}/load", params={"replica": str(i), "model": model}) as resp:
                await resp.read()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                async with session.get(f"{router}/v1/replicas") as resp:
                    table = (await resp.json())["replicas"]
                if any(r["name"] == sim.pod_name(i) and model in r["models"] for r in table):
                    break
                await asyncio.sleep(0.05)
            async with session.post(router + "/", json={"inputs": [1]}, headers={MODEL_ID_HEADER: model}) as resp:
                await resp.read()
            async with session.get(f"{control}/where", params={"model": model}) as resp:
                ok += (await resp.json())["pod"] == sim.pod_name(i)
    return ok, samples


def routers_agree(routers: list[tuple[str, subprocess.Popen, str]], control: str, replicas: int) -> str:
    """Stop the churn, wait past the coalescing interval and the learned-model age, and compare
    what each router's table says every replica holds: how many replicas all routers agree on."""
    urllib.request.urlopen(urllib.request.Request(control + "/pause", method="POST"), timeout=10).read()
    time.sleep(3.0)
    views = []
    for url, _, _ in routers:
        with urllib.request.urlopen(url + "/v1/replicas", timeout=30) as resp:
            views.append({r["name"]: (tuple(r["models"]), tuple(r["loading"])) for r in json.loads(resp.read())["replicas"]})
    same = sum(1 for name in views[0] if all(view.get(name) == views[0][name] for view in views[1:]))
    return f"{same}/{replicas}"


def routing_point(cluster: Cluster, args: argparse.Namespace, folder: Path, started: list[subprocess.Popen]) -> dict:
    say(f"routing point: {args.replicas} replicas x {args.models} models")
    cluster.namespace(NAMESPACE)
    cluster.node()
    port = free_port(sim.address(0))
    t0 = time.monotonic()
    create_pods(cluster, args.replicas, args.models, args.capacity, port)
    say(f"{args.replicas} pods created and Ready in {time.monotonic() - t0:.1f} s")
    control_port = free_port()
    control = f"http://127.0.0.1:{control_port}"
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig), "POD_NAMESPACE": NAMESPACE, "PYTHONUNBUFFERED": "1"}
    fleet = spawn([sys.executable, str(HERE / "fleet.py"), "--replicas", str(args.replicas), "--models", str(args.models),
                   "--capacity", str(args.capacity), "--port", str(port), "--control-port", str(control_port),
                   "--rate", str(args.rate or max(2.0, args.replicas / 10)), "--kubeconfig", str(cluster.cp.kubeconfig),
                   "--namespace", NAMESPACE], log=folder / "fleet.log", env=env)
    started.append(fleet)
    # Two routers by default, as a deployment runs: both watch the pods; requests go to the first.
    routers: list[tuple[str, subprocess.Popen, str]] = []
    for k in range(args.routers):
        router_port = free_port()
        log = f"router-{k}.log"
        routers.append((f"http://127.0.0.1:{router_port}", spawn(
            [sys.executable, "-m", "modelplex_launcher.cli", "--log-level", "warning", "router", "--spec",
             str(manifest(folder, args.capacity)), "--port", str(router_port)], log=folder / log, env=env), log))
        started.append(routers[-1][1])
    router, proc = routers[0][0], routers[0][1]

    def guard() -> None:
        for p, log in ((fleet, "fleet.log"), *((r[1], r[2]) for r in routers)):
            if p.poll() is not None:
                raise RuntimeError(f"{log} process exited: {(folder / log).read_text()[-2000:]}")

    def ready() -> bool:
        for url, _, _ in routers:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
                if json.loads(resp.read()).get("ready_replicas") != args.replicas:
                    return False
        return True

    wait_for(ready, 300, 0.5, f"the routers to see {args.replicas} ready replicas", guard=guard)
    say(f"the routers see every replica after {time.monotonic() - t0:.1f} s; measuring {args.seconds} s")
    rng = random.Random(2)
    urllib.request.urlopen(urllib.request.Request(control + "/reset", method="POST"), timeout=10).read()
    writes_before = cluster.requests_total(WRITE_VERBS)
    t_window = time.monotonic()
    latencies = asyncio.run(drive(router, control, args.seconds, args.request_rate, args.models, rng))
    window = time.monotonic() - t_window
    writes = cluster.requests_total(WRITE_VERBS) - writes_before
    stats = json.loads(urllib.request.urlopen(control + "/stats", timeout=10).read())
    went, tried = asyncio.run(routed_after_discovery(router, control, args.replicas, 20, rng))
    agree = routers_agree(routers, control, args.replicas) if len(routers) > 1 else None
    guard()
    router_rss = rss_mb(proc.pid)
    decisions = bench_decisions.run(args.replicas, args.models, 6000, None)
    return {
        "replicas": args.replicas, "models": args.models,
        "decision_p50_us_hit": decisions["decision_p50_us_hit"], "decision_p50_us_miss": decisions["decision_p50_us_miss"],
        "router_rss_mb": router_rss,
        "discovery_p50_ms": percentile(stats["discovery_ms"], 0.5), "discovery_p99_ms": percentile(stats["discovery_ms"], 0.99),
        "discovery_samples": len(stats["discovery_ms"]), "routed_after_discovery": f"{went}/{tried}",
        "patch_lag_p50_ms": percentile(stats["patch_lag_ms"], 0.5), "patch_lag_p99_ms": percentile(stats["patch_lag_ms"], 0.99),
        # The profile of discovery: each stage's p50 / p99 (fleet.py's STAGES), over the changes
        # a router read after the watch delivered them.
        "discovery_stages_ms": {stage: [percentile(ms, 0.5), percentile(ms, 0.99)] for stage, ms in stats["stages_ms"].items()},
        "read_before_watch": stats["read_before_watch"],
        "unread_at_end": stats["unread"], "routers": len(routers), "routers_agree": agree,
        "apiserver_writes_per_s": round(writes / window, 1), "loads_per_s": round(stats["loads"] / window, 1),
        "annotation_patches": stats["patches"], "request_p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "requests_ok": len(latencies), "window_s": round(window, 1),
    }


def deployments_point(cluster: Cluster, args: argparse.Namespace, folder: Path, started: list[subprocess.Popen]) -> dict:
    namespace = "scale-deployments"
    say(f"deployments point: {args.deployments} MultiplexedDeployments")
    cluster.cp.kubectl("apply", "-f", str(REPO / "crds" / "multiplexeddeployments.modelplex.io.yaml"))
    wait_for(lambda: cluster.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, "default", PLURAL) is not None,
             60, 0.5, "the CRD served", retry_on=(Exception,))
    cluster.namespace(namespace)
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig), "PYTHONUNBUFFERED": "1",
           "MODELPLEX_WATCH_NAMESPACES": namespace}
    if args.operator_threads:
        # An experiment, not the product: the operator's blocking API calls run on asyncio's
        # default executor, min(32, cores + 4) threads (6 here); this sizes it from outside.
        site = folder / "operator-site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "import concurrent.futures.thread as _t\n"
            "_init = _t.ThreadPoolExecutor.__init__\n"
            "def _sized(self, max_workers=None, *args, **kwargs):\n"
            f"    _init(self, max_workers or {args.operator_threads}, *args, **kwargs)\n"
            "_t.ThreadPoolExecutor.__init__ = _sized\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    operator = spawn([sys.executable, "-m", "modelplex_launcher.cli", "--log-level", "warning", "operator"],
                     log=folder / "operator.log", env=env)
    started.append(operator)
    time.sleep(5)  # let it list and settle before the burst
    if operator.poll() is not None:
        raise RuntimeError(f"the operator exited: {(folder / 'operator.log').read_text()[-2000:]}")
    calls_before = cluster.requests_by_kind()
    cpu_before = cpu_s(operator.pid)
    t0 = time.monotonic()

    def one(k: int) -> None:
        cluster.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, {
            "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": f"d{k}"},
            "spec": {"replicas": 1, "image": "modelplex-simulated", "handler": "simulated:Model"}})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(args.deployments)))
    applied_s = time.monotonic() - t0

    def all_reconciled() -> bool:
        items = cluster.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL)["items"]
        done = [i for i in items
                if (i.get("status") or {}).get("observedGeneration", 0) >= i["metadata"].get("generation", 1)]
        return len(done) == args.deployments

    def guard() -> None:
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited: {(folder / 'operator.log').read_text()[-2000:]}")

    wait_for(all_reconciled, args.reconcile_timeout, 0.5, f"{args.deployments} deployments reconciled", guard=guard)
    reconcile_s = time.monotonic() - t0
    operator_cpu_s = cpu_s(operator.pid) - cpu_before
    by_kind = cluster.requests_by_kind()
    by_kind.subtract(calls_before)
    calls = sum(by_kind.values())
    operator_calls = sum(value for (verb, resource), value in by_kind.items()
                         if resource in OPERATOR_RESOURCES and verb not in ("LIST", "WATCH"))
    # Who made them is not in the metric: the resource tells the operator's objects from the
    # controller-manager's (replicasets, pods) apart; the file keeps the whole breakdown.
    (folder / "deployments-calls.json").write_text(json.dumps(
        {f"{verb} {resource}": round(value) for (verb, resource), value in by_kind.most_common() if value}, indent=1))
    say("apiserver calls by verb and resource: " + ", ".join(
        f"{verb} {resource} {value:.0f}" for (verb, resource), value in by_kind.most_common(20) if value))
    return {"deployments": args.deployments, "operator_threads": args.operator_threads or "default",
            "reconcile_all_s": round(reconcile_s, 1), "applied_s": round(applied_s, 1),
            "operator_rss_mb": rss_mb(operator.pid), "operator_cpu_s": round(operator_cpu_s, 1),
            "operator_apiserver_calls": round(calls),
            "operator_object_calls": round(operator_calls),
            "operator_object_calls_per_deployment": round(operator_calls / args.deployments, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--deployments", type=int, default=0)
    parser.add_argument("--routers", type=int, default=2, help="routers watching the pool (requests go to the first)")
    parser.add_argument("--capacity", type=int, default=10, help="models per replica")
    parser.add_argument("--seconds", type=float, default=30.0, help="the routing point's measuring window")
    parser.add_argument("--rate", type=float, default=0.0, help="fleet loads a second (default: replicas / 10, at least 2)")
    parser.add_argument("--request-rate", type=float, default=50.0, help="requests a second through the router")
    parser.add_argument("--reconcile-timeout", type=float, default=300.0)
    parser.add_argument("--operator-threads", type=int, default=0,
                        help="experiment: size the operator's default thread pool (0: as shipped)")
    parser.add_argument("--keep", action="store_true", help="keep the state folder (logs) afterwards")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="modelplex-scale-"))
    say(f"state and logs in {folder}")
    started: list[subprocess.Popen] = []
    cluster = None
    deadline_guard = time.monotonic()
    try:
        cluster = Cluster(folder)
        say(f"control plane up in {time.monotonic() - deadline_guard:.1f} s")
        if args.replicas > 0:
            print(json.dumps(routing_point(cluster, args, folder, started)), flush=True)
            for proc in reversed(started):  # the fleet's churn must not load the next point
                stop(proc, grace=10)
            started.clear()
        if args.deployments > 0:
            print(json.dumps(deployments_point(cluster, args, folder, started)), flush=True)
    finally:
        for proc in reversed(started):
            stop(proc, grace=10)
        if cluster is not None:
            cluster.stop()
        if not args.keep:
            import shutil
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
