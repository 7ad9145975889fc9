"""The router's side of autoscaling: request rates, the load report, holding requests at zero."""

from __future__ import annotations

import asyncio
import random

import pytest

from modelplex.wire.errors import NotReady, Overloaded
from modelplex.wire.load import LoadReport
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.spec import parse_deployment
from modelplex_router.config import ENV_HOLD_AT_ZERO, RouterConfig
from modelplex_router.demand import RequestRates
from modelplex_router.discovery.static import StaticDiscovery
from modelplex_router.events import ReplicaSeen
from modelplex_router.policy import Params
from modelplex_router.record import Held
from modelplex_router.router import Router
from modelplex_router.scheduler import Scheduler
from modelplex_router.table import RoutingTable


def info(name: str, models=(), ready=True) -> ReplicaSeen:
    return ReplicaSeen(name, f"http://{name}", ready, Held.of(LoadedModels(version=1, capacity=3, models=tuple(models))))


def test_request_rates_count_each_model_over_the_window():
    rates = RequestRates(window_s=60)
    for second in range(30):
        rates.record("busy", 1000.0 + second)
        rates.record("busy", 1000.5 + second)
    rates.record("rare", 1029.0)
    assert rates.rates(1030.0) == {"busy": 1.0, "rare": 1 / 60}
    # At 1075 the window starts at second 1016: busy's first 16 seconds have left it, rare not.
    assert rates.rates(1075.0) == pytest.approx({"busy": 28 / 60, "rare": 1 / 60})
    assert rates.rates(1200.0) == {}


def test_the_load_report_has_each_replicas_requests_the_queue_and_the_rates():
    config = RouterConfig("recs", Params(max_ongoing=4, matching_timeout_s=1.0))
    now = [50.0]
    router = Router(config, StaticDiscovery([]), clock=lambda: now[0])
    table, scheduler = router.table, router.scheduler
    table.apply(info("r0", models=("m1",)), now[0])
    table.apply(info("r1", ready=False), now[0])
    leases = [scheduler.try_acquire("m1") for _ in range(3)]
    scheduler.demand.record("m1", now[0])
    scheduler.queued = 2  # two requests waiting
    report = LoadReport.from_json(router.load_report().to_json())
    assert report.deployment == "recs" and report.queued == 2
    assert [(r.name, r.ongoing, r.ready, r.models) for r in report.replicas] == [
        ("r0", 3, True, ("m1",)), ("r1", 0, False, ())]
    assert report.ongoing == 5
    assert report.model_rates == {"m1": pytest.approx(1 / 60)}
    for lease in leases:
        lease.release(ok=True)
    assert router.load_report().ongoing == 2


def test_the_report_names_the_most_requested_models_only(monkeypatch):
    from modelplex_router import load

    monkeypatch.setattr(load, "MAX_REPORTED_MODELS", 2)
    router = Router(RouterConfig("recs", Params(max_ongoing=4, matching_timeout_s=1.0)), StaticDiscovery([]),
                    clock=lambda: 10.0)
    for model, count in (("a", 3), ("b", 1), ("c", 5)):
        for _ in range(count):
            router.scheduler.demand.record(model, 10.0)
    assert set(router.load_report().model_rates) == {"a", "c"}


def test_only_autoscaled_deployments_hold_requests_at_zero():
    def config(spec, env=None):
        document = {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                    "metadata": {"name": "d"}, "spec": {"image": "i", "handler": "m:C", **spec}}
        return RouterConfig.from_deployment(parse_deployment(document), env=env or {})

    assert config({}).hold_at_zero_s is None
    assert config({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}).hold_at_zero_s == 60.0
    assert config({"autoscaling": {}}, {ENV_HOLD_AT_ZERO: "120"}).hold_at_zero_s == 120.0


def scheduler_for(loop, **kwargs) -> tuple[RoutingTable, Scheduler]:
    scheduler = Scheduler(Params(max_ongoing=1, matching_timeout_s=1.0), clock=loop.time,
                          rng=random.Random(0), deployment="d", **kwargs)
    return scheduler.table, scheduler


@pytest.mark.looptime
async def test_a_request_at_zero_replicas_is_held_and_goes_to_the_first_replica_ready():
    loop = asyncio.get_running_loop()
    table, scheduler = scheduler_for(loop, queue_timeout_s=10.0, hold_at_zero_s=60.0)
    waiter = asyncio.create_task(scheduler.acquire("m"))
    await asyncio.sleep(45.0)  # past the queue bound, within the hold
    assert not waiter.done() and scheduler.queued == 1
    table.apply(info("r0"), loop.time())
    lease = await asyncio.wait_for(waiter, 1)
    assert lease.replica.name == "r0" and loop.time() == pytest.approx(45.0, abs=0.01)
    assert scheduler.queued == 0


@pytest.mark.looptime
async def test_a_request_held_at_zero_past_the_hold_gets_503_with_retry_after():
    loop = asyncio.get_running_loop()
    table, scheduler = scheduler_for(loop, queue_timeout_s=10.0, hold_at_zero_s=60.0)
    with pytest.raises(NotReady) as raised:
        await scheduler.acquire("m")
    assert loop.time() == pytest.approx(60.0, abs=0.01)
    assert raised.value.status == 503 and raised.value.retry_after == 1.0
    assert "became ready within 60 s" in raised.value.message
    assert scheduler.queued == 0


@pytest.mark.looptime
async def test_full_replicas_keep_the_shorter_queue_bound():
    loop = asyncio.get_running_loop()
    table, scheduler = scheduler_for(loop, queue_timeout_s=10.0, hold_at_zero_s=60.0)
    table.apply(info("r0"), loop.time())
    held = await scheduler.acquire("m")
    with pytest.raises(Overloaded):
        await scheduler.acquire("m")
    assert loop.time() == pytest.approx(10.0, abs=0.01)
    held.release(ok=True)
