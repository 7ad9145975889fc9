"""A simulated replica fleet: ONE process answering as many replicas, each on its own loopback
address (127.0.1.1, 127.0.1.2, ...; :func:`address`), for the scale harness (``run.py``).

Each simulated replica has its own loaded models (LRU, ``--capacity`` of them) and answers what
the router reads of a real one: ``GET /v1/models`` (its loaded-models document), requests on any
other path (a model it does not hold is "loaded" at once, evicting the least recently used), with
the ``X-Modelplex-Loaded-Models`` summary header on every answer, and ``/readyz``. Its pod's
loaded-models annotation is kept by the replica's own reporter
(:class:`modelplex_replica.reporter.AnnotationReporter`: coalesced, at most one patch per
replica per interval) over the real Kubernetes API.

A Zipf(1.1) trace over ``--models`` models drives churn at ``--rate`` loads a second: each step
picks a model by popularity and a replica at random; a model the replica does not hold is
loaded there (a new document version, an annotation patch). For every change the fleet notes
when the replica's next ``GET /v1/models`` served that version or a newer one: that read is the
router taking the change into its table (discovery), so ``discovery_ms`` is the time from a
model being loaded to the router being able to route to it.

A control endpoint on ``127.0.0.1:--control-port`` answers ``GET /stats`` (JSON) and
``POST /reset`` (start a measurement window), ``POST /pause`` (stop the trace), ``POST /load?replica=I&model=M`` (load a model
there now), ``GET /read?replica=I`` (the newest version a router read) and
``GET /where?model=M`` (the pod that answered its last request). Stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import concurrent.futures
import json
import random
import signal
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from modelplex.wire.loaded import LoadedModels, LoadedSummary
from modelplex.wire.names import ANNOTATION_LOADED_MODELS, LOADED_MODELS_HEADER, MODEL_ID_HEADER
from modelplex_replica.reporter import AnnotationReporter


def address(i: int) -> str:
    """The loopback address of replica ``i`` (250 per /24, away from 127.0.0.1)."""
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


#: The pod of replica i, and the id of model k of the catalogue.
pod_name = "scale-replica-{}".format
model_name = "model-{}".format


def initial_models(i: int, models: int, capacity: int) -> tuple[str, ...]:
    """What replica ``i`` holds at the start: a stripe of the catalogue, so every model has a holder."""
    return tuple(model_name((i * capacity + k) % models) for k in range(min(capacity, models)))


def initial_summary(i: int, models: int, capacity: int) -> LoadedSummary:
    return LoadedModels(1, capacity, initial_models(i, models, capacity)).summary()


#: The stages of discovery, in order; each is the time from the previous stamp of a change
#: (``Change``) to its own, and the router's is the watch's delivery -> the router's read.
STAGES = ("coalesce", "queue", "write", "watch", "router")


@dataclass
class Change:
    """When each step towards the router carried one change of a replica's models."""

    version: int
    loaded: float
    snapshot: float | None = None  # the reporter took a state carrying it (after its interval)
    sent: float | None = None  # a worker thread began the patch (after the fleet's thread pool queue)
    answered: float | None = None  # the apiserver answered the patch
    watched: float | None = None  # a watch on the pods (this process's own) delivered it

    def stages_ms(self, read: float) -> dict[str, float] | None:
        stamps = (self.loaded, self.snapshot, self.sent, self.answered, self.watched, read)
        if any(t is None for t in stamps):
            return None
        return {stage: (stamps[k + 1] - stamps[k]) * 1000 for k, stage in enumerate(STAGES)}  # type: ignore[operator]


@dataclass
class SimReplica:
    index: int
    capacity: int
    models: OrderedDict[str, None]
    version: int = 1
    read_version: int = 0  # the newest version a GET /v1/models served
    #: (version, monotonic time) of changes not yet in the annotation
    unpatched: list[tuple[int, float]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # not yet read by a router
    reporter: AnnotationReporter | None = None

    def stamp(self, step: str, version: int, at: float) -> None:
        """The first time ``step`` carried each change up to ``version``."""
        for change in self.changes:
            if change.version <= version and getattr(change, step) is None:
                setattr(change, step, at)

    def snapshot(self) -> LoadedSummary:
        """The reporter's view of the state (it takes it when its interval allows a patch)."""
        summary = self.document().summary()
        self.stamp("snapshot", summary.version, time.monotonic())
        return summary

    def document(self) -> LoadedModels:
        return LoadedModels(self.version, self.capacity, tuple(self.models))

    def touch(self, model: str) -> bool:
        """A request for ``model``: load it if absent (evicting the LRU); whether that changed anything."""
        if model in self.models:
            self.models.move_to_end(model)
            return False
        if len(self.models) >= self.capacity:
            self.models.popitem(last=False)
        self.models[model] = None
        self.version += 1
        now = time.monotonic()
        self.unpatched.append((self.version, now))
        self.changes.append(Change(self.version, now))
        if self.reporter is not None:
            self.reporter.changed()
        return True


class Fleet:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.replicas = [SimReplica(i, args.capacity, OrderedDict.fromkeys(initial_models(i, args.models, args.capacity)))
                         for i in range(args.replicas)]
        self.by_address = {address(i): r for i, r in enumerate(self.replicas)}
        self.discovery_ms: list[float] = []
        self.patch_lag_ms: list[float] = []  # a change -> the annotation patch carrying it answered
        self.stages_ms: dict[str, list[float]] = {stage: [] for stage in STAGES}
        self.read_before_watch = 0  # changes a router read before the watch delivered them (a response header told it)
        self.loads = 0
        self.requests = 0
        self.paused = False
        self.served: dict[str, str] = {}  # model -> the pod that last answered a request for it
        self.rng = random.Random(args.seed)
        weights = [1 / (k + 1) ** 1.1 for k in range(args.models)]
        total = sum(weights)
        self.cumulative = []
        acc = 0.0
        for w in weights:
            acc += w / total
            self.cumulative.append(acc)

    def _replica(self, request: web.Request) -> SimReplica:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return self.by_address[sockname[0]]

    def _headers(self, replica: SimReplica) -> dict[str, str]:
        return {LOADED_MODELS_HEADER: replica.document().summary().to_json()}

    async def models(self, request: web.Request) -> web.Response:
        replica = self._replica(request)
        now = time.monotonic()
        for change in replica.changes:
            self.discovery_ms.append((now - change.loaded) * 1000)
            stages = change.stages_ms(now)
            if stages is None or stages["router"] < 0:
                self.read_before_watch += 1
                continue
            for stage, ms in stages.items():
                self.stages_ms[stage].append(ms)
        replica.changes.clear()
        replica.read_version = replica.version
        return web.json_response(replica.document().to_dict(), headers=self._headers(replica))

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def invoke(self, request: web.Request) -> web.Response:
        replica = self._replica(request)
        await request.read()
        model = request.headers.get(MODEL_ID_HEADER, "")
        self.requests += 1
        if model and replica.touch(model):
            self.loads += 1
        self.served[model] = pod_name(replica.index)
        return web.json_response({"outputs": [model]}, headers=self._headers(replica))

    def zipf(self) -> str:
        return model_name(min(bisect.bisect_left(self.cumulative, self.rng.random()), self.args.models - 1))

    async def churn(self) -> None:
        """The Zipf trace: ``--rate`` steps a second, each a model on a random replica."""
        if self.args.rate <= 0:
            return
        step = 1.0 / self.args.rate
        next_at = time.monotonic()
        while True:
            next_at += step
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if not self.paused and self.rng.choice(self.replicas).touch(self.zipf()):
                self.loads += 1

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({
            "discovery_ms": self.discovery_ms, "patch_lag_ms": self.patch_lag_ms,
            "stages_ms": self.stages_ms, "read_before_watch": self.read_before_watch,
            "loads": self.loads, "requests": self.requests,
            "patches": sum(r.reporter.patches for r in self.replicas if r.reporter is not None),
            "unread": sum(len(r.changes) for r in self.replicas),
        })

    async def reset(self, request: web.Request) -> web.Response:
        self.discovery_ms = []
        self.patch_lag_ms = []
        self.stages_ms = {stage: [] for stage in STAGES}
        self.read_before_watch = 0
        for replica in self.replicas:
            replica.unpatched.clear()
            replica.changes.clear()
        return web.json_response({"ok": True})

    async def pause(self, request: web.Request) -> web.Response:
        self.paused = True
        return web.json_response({"ok": True})

    async def load(self, request: web.Request) -> web.Response:
        replica = self.replicas[int(request.query["replica"])]
        if replica.touch(request.query["model"]):
            self.loads += 1
        return web.json_response({"version": replica.version})

    async def read(self, request: web.Request) -> web.Response:
        return web.json_response({"read_version": self.replicas[int(request.query["replica"])].read_version})

    async def where(self, request: web.Request) -> web.Response:
        return web.json_response({"pod": self.served.get(request.query.get("model", ""))})


def pod_patcher(kubeconfig: str, namespace: str, fleet: Fleet, threads: int) -> Any:
    """The patch function of each simulated replica's reporter: the Kubernetes client's pod
    patch, as the replica's own. Without deserializing the answer into client objects: a real
    replica spends that CPU in its own process, here one process does it for every replica."""
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=kubeconfig)
    api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = threads
    api = client.CoreV1Api(api_client)

    def patcher(replica: SimReplica):
        name = pod_name(replica.index)

        def patch(body: dict[str, Any]) -> None:
            version = json.loads(body["metadata"]["annotations"][ANNOTATION_LOADED_MODELS])["version"]
            replica.stamp("sent", version, time.monotonic())
            response = api.patch_namespaced_pod(name, namespace, body, _request_timeout=10, _preload_content=False)
            response.release_conn()
            done = time.monotonic()
            replica.stamp("answered", version, done)
            # Runs in a worker thread: list appends are atomic under the GIL.
            fleet.patch_lag_ms.extend((done - t) * 1000 for v, t in replica.unpatched if v <= version)
            replica.unpatched = [(v, t) for v, t in replica.unpatched if v > version]
        return patch

    return patcher


def watch_annotations(kubeconfig: str, namespace: str, fleet: Fleet) -> None:
    """A watch on the replica pods, as a router's, that stamps when each annotation version
    arrives (its own thread; the raw event lines, not client objects, as the patches)."""
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    listed = json.loads(api.list_namespaced_pod(namespace, _preload_content=False).data)
    response = api.list_namespaced_pod(namespace, watch=True, resource_version=listed["metadata"]["resourceVersion"],
                                       timeout_seconds=3600, _preload_content=False)
    by_pod = {pod_name(r.index): r for r in fleet.replicas}
    pending = b""
    for chunk in response.stream(65536):
        at = time.monotonic()
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            pod = json.loads(line)["object"]
            replica = by_pod.get(pod["metadata"]["name"])
            summary = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_LOADED_MODELS)
            if replica is not None and summary:
                replica.stamp("watched", json.loads(summary)["version"], at)


async def main_async(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=args.threads))
    fleet = Fleet(args)
    patcher = pod_patcher(args.kubeconfig, args.namespace, fleet, args.threads) if args.kubeconfig else None
    for replica in fleet.replicas:
        if patcher is not None:
            replica.reporter = AnnotationReporter(replica.snapshot, patcher(replica))
            replica.reporter.published = replica.document().summary()  # the harness created the pod with it
    app = web.Application()
    app.router.add_get("/v1/models", fleet.models)
    app.router.add_get("/readyz", fleet.ready)
    app.router.add_get("/healthz", fleet.ready)
    app.router.add_route("*", "/{tail:.*}", fleet.invoke)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for i in range(args.replicas):
        await web.TCPSite(runner, address(i), args.port, backlog=64).start()
    control = web.Application()
    control.router.add_get("/stats", fleet.stats)
    control.router.add_post("/reset", fleet.reset)
    control.router.add_get("/where", fleet.where)
    control.router.add_post("/load", fleet.load)
    control.router.add_post("/pause", fleet.pause)
    control.router.add_get("/read", fleet.read)
    control_runner = web.AppRunner(control, access_log=None)
    await control_runner.setup()
    await web.TCPSite(control_runner, "127.0.0.1", args.control_port).start()
    if args.kubeconfig:
        threading.Thread(target=watch_annotations, args=(args.kubeconfig, args.namespace, fleet), daemon=True,
                         name="annotation-watch").start()
    for replica in fleet.replicas:
        if replica.reporter is not None:
            await replica.reporter.start()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print(json.dumps({"fleet": "ready", "replicas": args.replicas}), flush=True)
    churn = asyncio.create_task(fleet.churn())
    await stop.wait()
    churn.cancel()
    for replica in fleet.replicas:
        if replica.reporter is not None:
            await replica.reporter.stop()
    await control_runner.cleanup()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--models", type=int, required=True)
    parser.add_argument("--capacity", type=int, default=10)
    parser.add_argument("--port", type=int, required=True, help="the replicas' port (on each one's address)")
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=10.0, help="trace steps (requests) a second")
    parser.add_argument("--kubeconfig", default="", help="patch each replica's pod annotation through this API")
    parser.add_argument("--namespace", default="scale")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=32, help="patches in flight at most (the reporters' threads)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
