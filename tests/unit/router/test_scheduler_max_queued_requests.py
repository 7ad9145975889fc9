"""``spec.router.maxQueuedRequests`` (Ray's ``max_queued_requests``): the waiters of all models
together, past which a new request is refused at once with Ray's ``BackPressureError`` (a real
scheduler and routing table, no sockets; looptime's virtual clock)."""

from __future__ import annotations

import asyncio
import random

import pytest

from modelplex.serve.exceptions import BackPressureError
from modelplex.wire.errors import Overloaded
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.spec import parse_deployment
from modelplex_router.config import RouterConfig
from modelplex_router.events import ReplicaSeen
from modelplex_router.policy import Params
from modelplex_router.record import Held
from modelplex_router.scheduler import Scheduler

pytestmark = pytest.mark.looptime


def one_slot(max_queued_requests: int | None) -> Scheduler:
    """One replica with one slot that holds models a and b."""
    loop = asyncio.get_running_loop()
    scheduler = Scheduler(Params(max_ongoing=1, matching_timeout_s=1.0), clock=loop.time, rng=random.Random(0),
                          deployment="d", queue_timeout_s=600.0, max_queued_requests=max_queued_requests)
    scheduler.table.apply(ReplicaSeen("r", "http://r", True, Held.of(LoadedModels(1, 4, ("a", "b")))), loop.time())
    return scheduler


async def test_past_the_bound_a_request_of_any_model_is_refused_at_once_with_rays_error():
    scheduler = one_slot(max_queued_requests=2)
    held = await scheduler.acquire("a")
    waiting = [asyncio.create_task(scheduler.acquire(model)) for model in "ab"]
    await asyncio.sleep(0)
    assert scheduler.queued == 2
    for model in "ab":  # the bound is the deployment's, not a model's
        with pytest.raises(BackPressureError) as raised:
            await scheduler.acquire(model)
        assert isinstance(raised.value, Overloaded) and raised.value.status == 503 and raised.value.retry_after
        assert raised.value.message == ("Request dropped due to backpressure (num_queued_requests=2, "
                                        "max_queued_requests=2).")
    held.release(ok=True)
    lease = await asyncio.wait_for(waiting[0], 5)
    assert scheduler.queued == 1
    third = asyncio.create_task(scheduler.acquire("b"))  # room again: it waits its turn
    await asyncio.sleep(0)
    assert scheduler.queued == 2 and not third.done()
    for task in (waiting[1], third):
        lease.release(ok=True)
        lease = await asyncio.wait_for(task, 5)
    lease.release(ok=True)


async def test_a_retry_was_admitted_already_and_is_not_refused_by_the_bound():
    scheduler = one_slot(max_queued_requests=1)
    held = await scheduler.acquire("a")
    first = asyncio.create_task(scheduler.acquire("a"))
    await asyncio.sleep(0)
    retry = asyncio.create_task(scheduler.acquire("a", exclude={"elsewhere"}))  # a replica refused it before
    await asyncio.sleep(0)
    assert scheduler.queued == 2 and not retry.done()
    for task in (first, retry):
        held.release(ok=True)
        held = await asyncio.wait_for(task, 5)
    held.release(ok=True)


async def test_without_the_bound_only_the_per_model_bound_refuses():
    scheduler = one_slot(max_queued_requests=None)
    held = await scheduler.acquire("a")
    waiting = [asyncio.create_task(scheduler.acquire("a")) for _ in range(20)]
    await asyncio.sleep(0)
    assert scheduler.queued == 20 and not any(task.done() for task in waiting)
    for task in waiting:
        held.release(ok=True)
        held = await asyncio.wait_for(task, 5)
    held.release(ok=True)


def test_the_router_reads_the_bound_from_the_spec():
    def config(router: dict) -> RouterConfig:
        return RouterConfig.from_deployment(parse_deployment({
            "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "recs"},
            "spec": {"image": "i", "handler": "m:C", "router": router}}), env={})

    assert config({"maxQueuedRequests": 7}).max_queued_requests == 7
    assert config({}).max_queued_requests is None
    with pytest.raises(Exception, match="maxQueuedRequests"):
        config({"maxQueuedRequests": 0})
