"""One autoscaler round, with the real ``kubernetes`` client against the API's HTTP shape on
loopback (support/apiserver.py) and a router's load report from a real HTTP server on a
loopback address of its own; time is a fake clock."""

from __future__ import annotations

import asyncio
import socket
import time
from contextlib import asynccontextmanager, contextmanager

import kopf
import pytest
from aiohttp import web
from kopf._core.engines import posting
from unit.operator.objects import body, deployment_of

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.load import LOAD_PATH, LoadReport, ReplicaLoad
from modelplex.wire.pins import PINS_PATH
from modelplex_operator import builders
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers.autoscale import AutoscaleLoop
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.observe import resource_view

ROUTER_IP = "127.0.0.41"
INTERNAL_TOKEN = "namespace-internal-token"
AUTOSCALING = {"minReplicas": 0, "maxReplicas": 3, "targetOngoingRequests": 2,
               "upscaleDelaySeconds": 0, "downscaleDelaySeconds": 10, "lookBackPeriodSeconds": 4}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name, role, ip, ready=True, cost=None):
    annotations = {} if cost is None else {"controller.kubernetes.io/pod-deletion-cost": str(cost)}
    return {"metadata": {"name": name, "labels": {"modelplex.io/role": role}, "annotations": annotations},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.fixture
async def router():
    """A router's load endpoint: ``router.report`` is what it answers."""
    holder = type("Router", (), {})()
    holder.report = None

    async def load(request):
        return web.Response(body=holder.report.to_json(), content_type="application/json")

    app = web.Application()
    app.router.add_get(LOAD_PATH, load)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as probe:
        probe.bind((ROUTER_IP, 0))
        holder.port = probe.getsockname()[1]
    await web.TCPSite(runner, ROUTER_IP, holder.port).start()
    try:
        yield holder
    finally:
        await runner.cleanup()


@contextmanager
def kopf_events():
    """kopf's Event queue, as the operator's tasks see it inside kopf."""
    queue: asyncio.Queue = asyncio.Queue()
    tokens = [(var, var.set(value)) for var, value in (
        (posting.settings_var, kopf.OperatorSettings()),
        (posting.event_queue_loop_var, asyncio.get_running_loop()),
        (posting.event_queue_var, queue),
    )]
    try:
        yield queue
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


@asynccontextmanager
async def replica_at(ip: str, loads: list, pins: list | None = None, api=None):
    """A replica's load and pin endpoints on ``ip`` (port 9000): ``loads`` gets each model
    loaded, ``pins`` each pin body with the API writes made before it came."""
    async def load_model(request):
        if request.headers.get(INTERNAL_TOKEN_HEADER) != INTERNAL_TOKEN:
            return web.json_response({"error": {"code": "unauthorized"}}, status=401)
        loads.append(request.match_info["model"])
        return web.json_response({"model": request.match_info["model"], "loaded": True})

    async def pin(request):
        sent = await request.json()
        pins.append((sent, [r.path.split("?")[0] for r in api.writes()]))
        return web.json_response({"pinned": {}, "loaded": sent["models"], "loading": [], "errors": {}})

    replica_app = web.Application()
    replica_app.router.add_post("/v1/models/{model}/load", load_model)
    replica_app.router.add_post(PINS_PATH, pin)
    runner = web.AppRunner(replica_app)
    await runner.setup()
    await web.TCPSite(runner, ip, 9000).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def rounds_until_scaled(ctx, api, view, clock, rounds: int = 8, writes: list | None = None) -> list:
    """Autoscaler rounds 2 s apart over a hot and a cold replica pod until the count changes
    (each round's writes appended to ``writes``)."""
    ctx.scaled[("team-a", "recs")] = 2
    loop = AutoscaleLoop(ctx, clock=clock)
    pods = {"kind": "PodList", "items": [pod("recs-router-1", "router", ROUTER_IP),
                                         pod("recs-replica-hot", "replica", "127.0.0.42"),
                                         pod("recs-replica-cold", "replica", "127.0.0.43")]}
    decisions = []
    try:
        for _ in range(rounds):
            api.reset()
            api.answers = [(200, pods)]
            decisions.append(await loop.round(("team-a", "recs"), view))
            if writes is not None:
                writes.append(list(api.writes()))
            clock.now += 2
            if decisions[-1].changed:
                break
    finally:
        await loop.stop()
        await ctx.pods.close()
    return decisions


def resource(port: int, **spec) -> dict:
    doc = body(autoscaling=AUTOSCALING, router={"replicas": 1, "port": port}, **spec)
    del doc["spec"]["replicas"]
    return resource_view(doc)


async def test_a_request_held_at_zero_starts_a_replica_and_the_hot_models_are_listed(api, router):
    clock = Clock()
    router.report = LoadReport("recs", at=time.time(), queued=1, model_rates={"m-hot": 2.0, "m-cold": 0.1})
    ctx = OperatorContext(config=OperatorConfig(), kube=api.kube())
    loop = AutoscaleLoop(ctx, clock=clock, wall=lambda: "2026-11-23T17:00:00Z")
    view = resource(router.port)
    api.answers = [(200, {"kind": "PodList", "items": [pod("recs-router-1", "router", ROUTER_IP)]})]
    try:
        with kopf_events() as events:
            decision = await loop.round(("team-a", "recs"), view)
    finally:
        await loop.stop()
        await ctx.pods.close()
    assert (decision.current, decision.desired) == (0, 1)
    calls = [(r.method, r.path.split("?")[0], r.body) for r in api.requests]
    assert calls[0][:2] == ("GET", "/api/v1/namespaces/team-a/pods")
    assert "labelSelector=modelplex.io%2Fdeployment%3Drecs" in api.requests[0].path
    assert ("PATCH", "/apis/apps/v1/namespaces/team-a/deployments/recs-replica/scale",
            {"spec": {"replicas": 1}}) in calls
    # A new ConfigMap: one create.
    (applied,) = [b for m, p, b in calls
                  if m == "POST" and p.endswith("/configmaps") and b["metadata"]["name"] == "recs-hot-models"]
    assert applied["data"] == {"hot-models": "m-hot\nm-cold\n"}
    assert ctx.scaled[("team-a", "recs")] == 1
    event = events.get_nowait()
    assert (event.type, event.reason) == ("Normal", "ScaledUp")
    assert "replicas 0 -> 1" in event.message and "waiting at zero" in event.message
    block = ctx.autoscaling[("team-a", "recs")]
    assert block["status"]["desiredReplicas"] == 1 and block["status"]["currentReplicas"] == 1
    assert block["status"]["lastScaleTime"] == "2026-11-23T17:00:00Z" and block["status"]["routers"] == "1/1"
    assert block["condition"]["status"] == "True"


async def test_costs_follow_the_caches_heat_and_the_coldest_pods_hot_model_moves_before_it_goes(api, router):
    """Two replicas, for longer than downscaleDelaySeconds a load one can carry: one goes. Every
    round keeps the pods' costs; the model only the leaving (colder) pod holds is loaded on the
    other first (a replica's load endpoint on loopback); then the count drops to 1."""
    clock = Clock()
    loads = []
    router.report = LoadReport("recs", at=time.time(), replicas=(
        ReplicaLoad("recs-replica-hot", ongoing=2, models=("m-hot",), capacity=4),
        ReplicaLoad("recs-replica-cold", models=("m-warm",), capacity=4),
    ), model_rates={"m-hot": 2.0, "m-warm": 0.5})
    ctx = OperatorContext(config=OperatorConfig(), kube=api.kube())
    ctx.credentials.remember(("team-a", "recs"), builders.internal_secret(  # as a reconcile does
        deployment_of(body()), builders.owner_reference(body()), INTERNAL_TOKEN))
    rounds: list = []
    with kopf_events() as events:
        async with replica_at("127.0.0.42", loads):
            decisions = await rounds_until_scaled(ctx, api, resource(router.port), clock, writes=rounds)
    assert [d.desired for d in decisions[:-1]] == [2] * (len(decisions) - 1)
    assert (decisions[-1].current, decisions[-1].desired) == (2, 1)
    assert loads == ["m-warm"]  # onto the staying pod, before the count dropped
    costs = {r.path.split("?")[0].rsplit("/", 1)[-1]: r.body["metadata"]["annotations"]
             for r in rounds[-2] if "/pods/" in r.path}
    assert costs == {"recs-replica-hot": {"controller.kubernetes.io/pod-deletion-cost": "120"},
                     "recs-replica-cold": {"controller.kubernetes.io/pod-deletion-cost": "30"}}
    # The scale-down round rewrites no cost: the ReplicaSet removes by the costs named in the Event.
    writes = [(r.path.split("?")[0], r.body) for r in rounds[-1]]
    assert writes == [("/apis/apps/v1/namespaces/team-a/deployments/recs-replica/scale", {"spec": {"replicas": 1}})]
    assert events.get_nowait().reason == "ScaledDown"


async def test_a_pinned_model_only_the_leaving_pod_holds_is_pinned_on_the_staying_pod_before_the_count_drops(
        api, router):
    clock = Clock()
    loads, pins = [], []
    router.report = LoadReport("recs", at=time.time(), replicas=(
        ReplicaLoad("recs-replica-hot", ongoing=2, models=("m-hot",), capacity=4),
        ReplicaLoad("recs-replica-cold", models=("m-pinned",), capacity=4),
    ), model_rates={"m-hot": 2.0, "m-pinned": 0.5})
    ctx = OperatorContext(config=OperatorConfig(), kube=api.kube())
    view = resource(router.port, models=[{"match": "m-pinned", "minCopies": 1}])
    with kopf_events():
        async with replica_at("127.0.0.42", loads, pins, api):
            decisions = await rounds_until_scaled(ctx, api, view, clock)
    assert (decisions[-1].current, decisions[-1].desired) == (2, 1)
    ((sent, written_before),) = pins
    assert sent == {"models": ["m-pinned"], "ttlSeconds": 30.0, "wait": True}
    assert not any(path.endswith("/scale") for path in written_before)  # pinned, then scaled
    assert api.writes()[-1].path.split("?")[0].endswith("/deployments/recs-replica/scale")
