"""A scale-down keeps declared copies: the pods that stay pin them (and load them) before a pod
goes. The replicas' pin endpoint is a real HTTP server on loopback addresses (port 9000, as in a
pod), the API the scripted one (support/apiserver.py)."""

from __future__ import annotations

from contextlib import asynccontextmanager

from aiohttp import web
from unit.operator.objects import body, deployment_of

from modelplex.wire.loaded import LoadedSummary
from modelplex.wire.names import REPLICA_PORT
from modelplex.wire.pins import PINS_PATH
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.observe import Indexes
from modelplex_operator.handlers.pinned import before_scale_down
from modelplex_operator.pinning import LEAVING_COST, leaving_for_scale_down, prewarm_plan
from modelplex_operator.status import DeploymentView, PodView

KEY = ("team-a", "recs")
DECLARED = [{"match": "m-pinned", "minCopies": 1}]


def test_the_pods_not_ready_go_first_then_the_last_by_name():
    pods = [PodView("recs-a", True), PodView("recs-c", True), PodView("recs-b", False), PodView("recs-ab", True)]
    assert leaving_for_scale_down(pods, 2) == ["recs-b", "recs-c"]
    assert leaving_for_scale_down(pods, 0) == []


def test_the_plan_pins_on_the_staying_pods_what_the_routers_will_place_there():
    plan = prewarm_plan({"a": 2, "b": 1}, {"p1": 4, "p2": 4})
    assert sorted(plan) == ["p1", "p2"] and all("a" in models for models in plan.values())
    assert sum("b" in models for models in plan.values()) == 1
    assert prewarm_plan({"a": 1}, {}) == {}


@asynccontextmanager
async def replicas(*ips: str):
    """A pin endpoint on each loopback address; yields what each was asked, in order."""
    asked: list[tuple[str, dict]] = []

    async def pin(request: web.Request) -> web.Response:
        sent = await request.json()
        asked.append((request.host.split(":")[0], sent))
        return web.json_response({"pinned": {m: 30 for m in sent["models"]}, "loaded": sent["models"],
                                  "loading": [], "errors": {}})

    app = web.Application()
    app.router.add_post(PINS_PATH, pin)
    runner = web.AppRunner(app)
    await runner.setup()
    for ip in ips:
        await web.TCPSite(runner, ip, REPLICA_PORT).start()
    try:
        yield asked
    finally:
        await runner.cleanup()


def context(api, pods: list[PodView], wanted_now: int) -> OperatorContext:
    ctx = OperatorContext(config=OperatorConfig(), kube=api.kube())
    ctx.indexes = Indexes(resources={}, pods={KEY: pods},
                          deployments={KEY: [DeploymentView("recs-replica", "replica", replicas=wanted_now)]})
    return ctx


async def test_a_spec_replicas_scale_down_marks_the_leaving_pod_and_pins_on_the_staying_one_first(api):
    pods = [PodView("recs-replica-a", True, summary=LoadedSummary(capacity=3), ip="127.0.0.51"),
            PodView("recs-replica-b", True, summary=LoadedSummary(capacity=3), ip="127.0.0.52")]
    ctx = context(api, pods, wanted_now=2)
    async with replicas("127.0.0.51", "127.0.0.52") as asked:
        await before_scale_down(ctx, KEY, deployment_of(body(replicas=1, models=DECLARED)))
    assert asked == [("127.0.0.51", {"models": ["m-pinned"], "ttlSeconds": 30.0, "wait": True})]
    (marked,) = [r for r in api.writes() if "/pods/" in r.path]
    assert marked.path.split("?")[0].endswith("/pods/recs-replica-b")
    assert marked.body["metadata"]["annotations"] == {"controller.kubernetes.io/pod-deletion-cost": str(LEAVING_COST)}


async def test_nothing_moves_without_declared_copies_or_on_a_scale_up(api):
    pods = [PodView("recs-replica-a", True, ip="127.0.0.51"), PodView("recs-replica-b", True, ip="127.0.0.52")]
    async with replicas("127.0.0.51", "127.0.0.52") as asked:
        await before_scale_down(context(api, pods, 2), KEY, deployment_of(body(replicas=1)))
        await before_scale_down(context(api, pods, 2), KEY, deployment_of(body(replicas=3, models=DECLARED)))
        await before_scale_down(context(api, pods, 2), KEY, deployment_of(body(replicas=2, models=DECLARED)))
    assert asked == [] and api.writes() == []
