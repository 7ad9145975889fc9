"""The scheduler's line in weighted fair order, with per-model bounds (a real scheduler and
routing table, no sockets; looptime's virtual clock)."""

from __future__ import annotations

import asyncio
import random

import pytest

from modelplex.wire.errors import Overloaded
from modelplex.wire.loaded import LoadedModels
from modelplex_router.events import ReplicaSeen
from modelplex_router.metrics import RouterMetrics
from modelplex_router.policy import Params
from modelplex_router.record import Held
from modelplex_router.scheduler import Lease, Scheduler

pytestmark = pytest.mark.looptime


def one_slot(fair: bool = True, weights: dict[str, float] | None = None, max_queued: int = 1000) -> Scheduler:
    """One replica with one slot that holds models a and b."""
    loop = asyncio.get_running_loop()
    scheduler = Scheduler(Params(max_ongoing=1, matching_timeout_s=1.0), clock=loop.time, rng=random.Random(0),
                          deployment="d", queue_timeout_s=600.0, max_queued=max_queued, fair=fair,
                          weight=lambda model: (weights or {}).get(model, 1.0))
    scheduler.table.apply(ReplicaSeen("r", "http://r", True, Held.of(LoadedModels(1, 4, ("a", "b")))), loop.time())
    return scheduler


async def queue(scheduler: Scheduler, models: str) -> list[asyncio.Task[Lease]]:
    tasks = []
    for model in models:
        tasks.append(asyncio.create_task(scheduler.acquire(model)))
        await asyncio.sleep(0)  # joins the line in this order
    return tasks


async def hand_out(scheduler: Scheduler, held: Lease, tasks: list[asyncio.Task[Lease]]) -> list[str]:
    """Free the one slot until every waiter had it: the models in the order they got it."""
    order = []
    lease = held
    pending = set(tasks)
    while pending:
        lease.release(ok=True)
        done, pending = await asyncio.wait(pending, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "one freed slot serves one waiter"
        lease = done.pop().result()
        order.append(lease.model)
    lease.release(ok=True)
    return order


async def test_a_request_for_another_model_gets_the_next_slot_not_the_flood_s_last():
    scheduler = one_slot()
    held = await scheduler.acquire("a")
    tasks = await queue(scheduler, "aaaaaaaaab")
    order = await hand_out(scheduler, held, tasks)
    assert order.index("b") <= 1 and order.count("a") == 9


async def test_first_come_first_served_serves_the_other_model_after_the_flood():
    scheduler = one_slot(fair=False)
    held = await scheduler.acquire("a")
    tasks = await queue(scheduler, "aaaaaaaaab")
    assert await hand_out(scheduler, held, tasks) == list("aaaaaaaaab")


async def test_weights_share_the_slot_between_waiting_models():
    scheduler = one_slot(weights={"b": 3.0})
    held = await scheduler.acquire("a")
    tasks = await queue(scheduler, "aaaaaaaa" + "bbbbbbbb")
    order = await hand_out(scheduler, held, tasks)
    assert order[:8].count("b") == 6  # three of b for one of a while both wait


async def test_a_model_alone_uses_every_slot():
    scheduler = one_slot(weights={"a": 0.001})
    held = await scheduler.acquire("a")
    tasks = await queue(scheduler, "aaaaa")
    assert await hand_out(scheduler, held, tasks) == list("aaaaa")
    assert scheduler.queued == 0 and scheduler.waiting() == []


async def test_one_model_s_flood_is_refused_for_that_model_only():
    scheduler = one_slot(max_queued=3)
    held = await scheduler.acquire("a")
    tasks = await queue(scheduler, "aaa")
    with pytest.raises(Overloaded) as raised:
        await scheduler.acquire("a")
    assert raised.value.status == 503 and raised.value.retry_after and "model 'a'" in raised.value.message
    other = await queue(scheduler, "b")  # another model still waits for its turn
    assert dict(scheduler.waiting()) == {"a": 3, "b": 1}
    assert sorted(await hand_out(scheduler, held, tasks + other)) == list("aaab")


async def test_the_waiting_requests_of_each_model_are_a_metric_with_the_model_label_only():
    scheduler = one_slot()
    held = await scheduler.acquire("a")
    tasks = await queue(scheduler, "aab")
    labelled, plain = RouterMetrics("d", model_label=True), RouterMetrics("d")
    for metrics in (labelled, plain):
        metrics.watch_queues(scheduler.waiting)
    text = labelled.render().decode()
    assert 'modelplex_router_model_queued_requests{deployment="d",model="a"} 2.0' in text
    assert 'modelplex_router_model_queued_requests{deployment="d",model="b"} 1.0' in text
    assert "modelplex_router_model_queued_requests" not in plain.render().decode()
    await hand_out(scheduler, held, tasks)
    assert "model=" not in labelled.render().decode().split("modelplex_router_model_queued_requests")[-1]
