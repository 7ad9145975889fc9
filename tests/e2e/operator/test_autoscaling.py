"""Autoscaling that knows the cache, end to end: the chart's operator, real pods, HTTP through the router.

One deployment with ``minReplicas: 0, maxReplicas: 3, targetOngoingRequests: 2`` (short delays so
it runs in a few minutes) of ``mxd_handler:Slow`` (synchronous work inside ``async def``), through
its whole life:

1. idle, it has no replica pod, and ``kubectl scale`` is refused naming autoscaling;
2. one request is held by the router and answered 200 once the scale-up's replica is ready;
3. sustained load at concurrency 8 (bounded in count and time) brings 3 replicas;
4. lighter load (concurrency 4: 2 replicas wanted) removes one pod: the one whose cache is the
   coldest, which the test works out itself from the replicas' ``GET /v1/models`` and the
   routers' request rates (``GET /v1/load``), which carried the lowest pod-deletion-cost, and
   which the operator's ``ScaledDown`` Event names;
5. idle again, the pool goes back to zero, and the hot-models ConfigMap lists the hot models,
   as many as the pre-load rule says (``modelplex.autoscaling.preload_count``);
6. a request starts a new replica, which pre-loaded the hot models before it turned ready: its
   first requests for them are cache hits.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client

from modelplex.autoscaling import preload_count
from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import READY_TIMEOUT, get_mxd, kubectl_apply, manifest, pods, predict, router_url, wait_event

pytestmark = pytest.mark.e2e

AUTOSCALING = {"minReplicas": 0, "maxReplicas": 3, "targetOngoingRequests": 2,
               "upscaleDelaySeconds": 2, "downscaleDelaySeconds": 12, "lookBackPeriodSeconds": 4}
HOT = ("hot-a", "hot-b")
COLD = ("cold-c",)
#: Requested now and then beside the hot ones under the lighter load: with them more models
#: have a rate than a new replica pre-loads, so the hot-models list is as long as the rule says.
WARM = ("warm-d", "warm-e", "warm-f")
MAX_MODELS_PER_REPLICA = 4
WORK_S = 0.25
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: Every load phase stops after this many requests or seconds, whichever comes first.
MAX_REQUESTS = 4000
MAX_LOAD_S = 240
#: A scale-down's pick is checked against the heat this test saw within this many seconds before
#: the pod was seen leaving: the rounds (``TICK_S``) whose costs it went by, and its moves.
RECENT_LOOKS_S = 15


def autoscaled_manifest(name: str) -> dict:
    # Two requests at a time per replica (the target): the router spreads a busy model to the new
    # replicas. One router, so its count of a replica's slots is the whole count.
    doc = manifest(name, handler="mxd_handler:Slow", autoscaling=AUTOSCALING, maxOngoingRequests=2,
                   multiplexing={"maxModelsPerReplica": MAX_MODELS_PER_REPLICA}, gracefulShutdownTimeoutSeconds=2,
                   router={"replicas": 1})
    del doc["spec"]["replicas"], doc["spec"]["batching"]
    return doc


class Load:
    """``workers`` threads sending requests for ``models`` (picked at random) until stopped,
    bounded in count and time; ``codes`` counts the answers' statuses."""

    def __init__(self, url: str, workers: int, models: list[str]):
        self.url, self.workers, self.models = url, workers, models
        self.stop = threading.Event()
        self.sent = itertools.count()
        self.codes: Counter[int] = Counter()
        self.errors: list = []
        self.deadline = time.monotonic() + MAX_LOAD_S

    def _worker(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set() and time.monotonic() < self.deadline and next(self.sent) < MAX_REQUESTS:
            code, answer = predict(self.url, rng.choice(self.models), {"work_s": WORK_S}, timeout=90)
            self.codes[code] += 1
            if code != 200 and len(self.errors) < 5:
                self.errors.append(answer)

    def __enter__(self) -> Load:
        self.pool = ThreadPoolExecutor(self.workers)
        self.futures = [self.pool.submit(self._worker, seed) for seed in range(self.workers)]
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for future in self.futures:
            future.result(timeout=120)
        self.pool.shutdown()


def get_json(url: str, timeout: float = 3, token: str | None = None):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"X-Modelplex-Internal-Token": token} if token else {})
    with opener.open(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def internal_token(api, ns: str, name: str) -> str:
    """The deployment's internal credential: a replica's API answers nobody else."""
    secret = client.CoreV1Api(api).read_namespaced_secret(f"{name}-internal", ns)
    return base64.b64decode(secret.data["token"]).decode()


def heat_by_pod(api, ns: str, name: str) -> dict[str, float]:
    """Each live replica pod's cache heat, worked out here as the operator should: the routers'
    request rate (per second) of each model it holds, shared among the pods holding a copy."""
    replicas = [p for p in pods(api, ns, name) if p.status.pod_ip]
    routers = [p for p in pods(api, ns, name, role="router") if p.status.pod_ip]
    token = internal_token(api, ns, name)
    held = {p.metadata.name: set(get_json(f"http://{p.status.pod_ip}:9000/v1/models", token=token)["models"])
            for p in replicas}
    rates: Counter[str] = Counter()
    for router in routers:
        rates.update(get_json(f"http://{router.status.pod_ip}:8000/v1/load")["model_rates"])
    copies = Counter(model for models in held.values() for model in models)
    return {pod: sum(rates[m] / copies[m] for m in models) for pod, models in held.items()}


def autoscaling_status(api, ns: str, name: str) -> dict:
    return (get_mxd(api, ns, name).get("status") or {}).get("autoscaling") or {}


def test_scale_from_zero_up_to_three_down_by_the_coldest_cache_and_back(control_plane, modelplex_operator,
                                                                         kube_namespace, api):
    ns, name = kube_namespace, "auto"
    apps = client.AppsV1Api(api)
    kubectl_apply(control_plane, ns, autoscaled_manifest(name))

    # 1. Idle: no replica pod; the autoscaler says so; kubectl scale is refused.
    wait_for(lambda: autoscaling_status(api, ns, name).get("routers", "").startswith("1/"),
             timeout=READY_TIMEOUT, what="status.autoscaling from the routers' load reports")
    status = autoscaling_status(api, ns, name)
    assert status["desiredReplicas"] == 0 and status["currentReplicas"] == 0, status
    assert apps.read_namespaced_deployment(f"{name}-replica", ns).spec.replicas == 0
    assert pods(api, ns, name) == []
    refused = control_plane.kubectl("scale", "mxd", name, "-n", ns, "--replicas", "2", check=False)
    assert refused.returncode != 0 and "autoscaling" in refused.stderr, refused.stderr
    assert apps.read_namespaced_deployment(f"{name}-replica", ns).spec.replicas == 0

    # 2. One request at zero is held, a replica starts for it, and it is answered.
    url = router_url(control_plane, ns, name)  # the routers are ready at zero: they hold requests
    code, answer = predict(url, HOT[0], {"work_s": 0}, timeout=120)
    assert code == 200, answer
    (first,) = pods(api, ns, name)
    assert answer["pod"] == first.metadata.name and answer["model"] == HOT[0]
    scaled_up = wait_event(api, ns, name, "ScaledUp")
    assert "replicas 0 -> 1" in scaled_up[2] and "waiting at zero" in scaled_up[2], scaled_up

    # 3. Sustained load at concurrency 8 (target 2 per replica): up to maxReplicas, 3.
    mix = [*HOT, *HOT, *HOT, *COLD]
    with Load(url, 8, mix) as load:
        def three_ready():
            ready = [p for p in pods(api, ns, name)
                     if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())]
            return len(ready) == 3
        wait_for(three_ready, timeout=READY_TIMEOUT, interval=1, what="3 ready replica pods under load")
        time.sleep(8)  # every replica serves a while: the routers learn what each one holds
        status = autoscaling_status(api, ns, name)
    assert set(load.codes) == {200}, (load.codes, load.errors)
    assert status["desiredReplicas"] == 3 and status["currentReplicas"] == 3, status
    assert len(status["replicas"]) == 3 and status["lastScaleReason"], status
    assert apps.read_namespaced_deployment(f"{name}-replica", ns).spec.replicas == 3

    # 4. Lighter load, mostly on the hot models (concurrency 4: 2 replicas wanted): one pod goes,
    # the coldest.
    with Load(url, 4, [*HOT, *HOT, *HOT, *WARM]) as load:
        looks: list[tuple[float, dict[str, float]]] = []  # (when, heat by pod), while nobody was leaving
        leaving = []
        deadline = time.monotonic() + 120
        while not leaving and time.monotonic() < deadline:
            try:
                heat = heat_by_pod(api, ns, name)
            except OSError:
                heat = None  # a pod between states: the next look
            everyone = pods(api, ns, name, live_only=False)
            leaving = [p for p in everyone if p.metadata.deletion_timestamp]
            if not leaving and heat is not None:
                # Worked out while nobody was leaving: a pod marked for deletion during the look
                # would be missing from it.
                looks.append((time.monotonic(), heat))
            time.sleep(0.5)
        seen_leaving = time.monotonic()
    assert leaving, f"no replica removed under the lighter load: {autoscaling_status(api, ns, name)}"
    assert set(load.codes) == {200}, (load.codes, load.errors)
    assert len(leaving) == 1, [p.metadata.name for p in leaving]
    removed = leaving[0].metadata.name
    # The ReplicaSet removed the pod with the lowest pod-deletion-cost: the operator stops writing a
    # leaving pod's cost, so the listing that first shows it leaving holds the costs it was chosen by.
    costs = {p.metadata.name: int((p.metadata.annotations or {})[DELETION_COST]) for p in everyone}
    assert costs[removed] == min(costs.values()), costs
    # That was the operator's own pick, named in its Event...
    scaled_down = wait_event(api, ns, name, "ScaledDown")[2]
    assert "replicas 3 -> 2" in scaled_down and f"the coldest caches go: {removed} (cost" in scaled_down, scaled_down
    # ...and the coldest cache as this test works it out, from the replicas' models and the routers'
    # rates. The pick goes by costs written a round or two before the scale-down, from what the
    # routers then knew each replica held, and under load the holdings move by whole models (each
    # replica loads what lands on it and evicts its least recently used; the scale-down round
    # loads the leaving pod's hot models elsewhere): so the coldest in one of this test's looks of
    # the last few rounds (within a tenth, and a request a minute).
    recent = [heat for when, heat in looks if when >= seen_leaving - RECENT_LOOKS_S]
    assert any(removed in heat and heat[removed] <= min(heat.values()) * 1.1 + 1 / 60 for heat in recent), \
        f"removed {removed}, never the coldest in the last {RECENT_LOOKS_S} s: {recent}"

    # 5. Idle: back to zero, and the hot models are what a new replica will pre-load.
    def at_zero():
        status = autoscaling_status(api, ns, name)
        return status.get("desiredReplicas") == 0 and not pods(api, ns, name, live_only=False)

    wait_for(at_zero, timeout=READY_TIMEOUT, interval=1, what="the pool back at zero replicas")
    hot_file = client.CoreV1Api(api).read_namespaced_config_map(f"{name}-hot-models", ns).data["hot-models"]
    assert set(hot_file.split()[:2]) == set(HOT), hot_file
    # As many as the one rule of local mode and the operator says: min(the replicas' capacity,
    # MAX_PRELOAD_MODELS). Five or six models had requests in the last minute (the routers' window): the
    # rule, not the requests, bounds the list.
    assert len(hot_file.split()) == preload_count(None, MAX_MODELS_PER_REPLICA) == 4, hot_file

    # 6. A request starts a new replica, which loaded the hot models before it was ready.
    code, answer = predict(url, HOT[0], {"work_s": 0}, timeout=120)
    assert code == 200, answer
    (new,) = pods(api, ns, name)
    assert new.metadata.name != first.metadata.name and answer["pod"] == new.metadata.name
    assert answer["hit"] is True, answer
    code, answer = predict(url, HOT[1], {"work_s": 0})
    assert code == 200 and answer["pod"] == new.metadata.name and answer["hit"] is True, answer
