"""The status keeper: one status write for a burst of pokes, none when nothing changed, writes
refused for a replaced or deleted resource dropped, repairs that apply the objects again, and
Ready flipping posted as an Event; its client is the real one, against an API server's HTTP
shape on loopback."""

from __future__ import annotations

import asyncio

import kopf
import pytest
from unit.operator.objects import UID, body

from modelplex.processes import wait_for_async
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers.keeper import StatusKeeper
from modelplex_operator.handlers.lifecycle import Operator
from modelplex_operator.handlers.observe import Indexes, resource_view
from modelplex_operator.kube import KubeError
from modelplex_operator.status import OK, DeploymentView, Outcome, PodView, condition

from support.apiserver import ScriptedApiServer

KEY = ("team-a", "recs")
STATUS_PATH = "/apis/modelplex.io/v1alpha1/namespaces/team-a/multiplexeddeployments/recs/status"
T0 = "2026-01-01T00:00:00Z"


@pytest.fixture
def events(monkeypatch) -> list[tuple[str, str, str]]:
    """The Events the keeper posts (kopf's poster runs only inside a running operator; the e2e
    suite sees them in the cluster)."""
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda obj, type, reason, message: posted.append(
        (type, reason, message)))
    return posted


def keeper_for(api: ScriptedApiServer, **resource) -> StatusKeeper:
    """The keeper as the operator wires it (it repairs through the reconcile's apply)."""
    operator = Operator.build(OperatorConfig(), api.kube())
    ctx = operator.context
    ctx.record(KEY, Outcome(UID, 1, OK, "Reconciled"))
    keeper = StatusKeeper(ctx, operator.keeper.repair, debounce_s=0.01, clock=lambda: T0)
    ctx.indexes = indexes(**resource)
    return keeper


def indexes(ready: int = 0, resource_version: str = "7", **spec) -> Indexes:
    view = resource_view(body(replicas=2, **spec))
    view["metadata"]["resourceVersion"] = resource_version
    deployments = [
        DeploymentView("recs-replica", "replica", 1, 1, 2, 2, ready, 2, ready),
        DeploymentView("recs-router", "router", 1, 1, 1, 1, 1, 1, 1),
    ]
    pods = [PodView(f"recs-replica-{i}", ready=i < ready) for i in range(2)]
    return Indexes(resources={KEY: [view]}, pods={KEY: pods}, deployments={KEY: deployments})


def status_writes(api: ScriptedApiServer) -> list[dict]:
    return [request.body for request in api.requests if request.path == STATUS_PATH]


async def test_a_burst_of_pokes_makes_one_status_write(api, events):
    keeper = keeper_for(api, ready=2)

    async def written() -> int:
        return keeper.writes

    try:
        for _ in range(5):  # a replica patching its annotation after every load
            keeper.poke(KEY)
        await wait_for_async(written, timeout=30, what="the status write")
    finally:
        await keeper.stop()
    (written,) = status_writes(api)
    assert written["metadata"] == {"uid": UID}  # only the object of that uid, never a new one of its name
    assert condition(written["status"], "Ready")["status"] == "True"
    assert written["status"]["readyReplicas"] == 2 and keeper.writes == 1
    assert events == [("Normal", "Ready", "2/2 replicas and 1/1 routers ready")]


async def test_an_unchanged_status_is_not_written_again_until_something_changes(api, events):
    keeper = keeper_for(api, ready=1)
    first = await keeper.refresh(KEY)
    assert condition(first, "Ready")["status"] == "False" and events == []
    # The index has not caught up with the write yet (same resourceVersion): still nothing new.
    assert await keeper.refresh(KEY) is None
    keeper.ctx.indexes = indexes(ready=2, resource_version="8")
    second = await keeper.refresh(KEY)
    assert condition(second, "Ready")["status"] == "True"
    assert [w["status"]["readyReplicas"] for w in status_writes(api)] == [1, 2]
    assert events == [("Normal", "Ready", "2/2 replicas and 1/1 routers ready")]
    await keeper.stop()


@pytest.mark.parametrize("refusal", [404, 409, 422])
async def test_a_write_refused_for_a_deleted_or_replaced_resource_is_dropped(api, events, refusal):
    keeper = keeper_for(api, ready=2)
    api.answers = [(refusal, "the object has been modified")]
    assert await keeper.refresh(KEY) is None
    assert keeper.writes == 0 and events == []
    await keeper.stop()


async def test_a_write_that_may_succeed_later_fails_the_refresh_for_the_loop_to_retry(api, events):
    keeper = keeper_for(api, ready=2)
    api.answers = [(503, "etcd leader changed")]
    with pytest.raises(KubeError) as caught:
        await keeper.refresh(KEY)
    assert caught.value.retryable and keeper.writes == 0
    assert condition(await keeper.refresh(KEY), "Ready")["status"] == "True"  # the retry writes it
    await keeper.stop()


async def test_a_resource_gone_from_the_index_is_forgotten(api, events):
    keeper = keeper_for(api)
    keeper.ctx.indexes = Indexes(resources={}, pods={}, deployments={})
    assert await keeper.refresh(KEY) is None
    assert KEY not in keeper.ctx.outcomes and api.requests == []
    await keeper.stop()


async def test_a_repair_poke_applies_the_desired_objects_again(api, events):
    keeper = keeper_for(api, ready=2)
    keeper.ctx.outcomes.clear()  # an operator restarted: nothing applied yet in this process
    await keeper.refresh(KEY, repair=True)
    applied = [r.body["kind"] for r in api.writes() if "fieldManager=modelplex-operator" in r.path]
    assert {"ServiceAccount", "ConfigMap", "Service", "Deployment"} <= set(applied)
    assert all(r.body["metadata"]["ownerReferences"][0]["uid"] == UID
               for r in api.writes() if r.path != STATUS_PATH)
    assert keeper.ctx.outcomes[KEY].state == OK
    await keeper.stop()


async def test_the_autoscalers_status_changes_poke_the_keeper_as_the_operator_wires_them(api, events):
    operator = Operator.build(OperatorConfig(), api.kube())
    operator.context.record(KEY, Outcome(UID, 1, OK, "Reconciled"))
    operator.context.indexes = indexes(ready=2)

    async def written() -> int:
        return operator.keeper.writes

    try:
        operator.autoscaler.on_status(KEY)
        await wait_for_async(written, timeout=30, what="the status write")
    finally:
        await operator.keeper.stop()
    assert len(status_writes(api)) == 1


async def test_a_burst_of_resources_is_refreshed_a_few_at_a_time_each_once(api, events):
    template = keeper_for(api)
    started: list[tuple[str, str]] = []
    finished: list[tuple[str, str]] = []
    running = asyncio.Event()
    gate = asyncio.Event()

    class Held(StatusKeeper):
        async def refresh(self, key, *, repair=False):  # the refreshes wait until the gate opens
            started.append(key)
            running.set()
            await gate.wait()
            finished.append(key)
            return None

    keeper = Held(template.ctx, template.repair, debounce_s=0.01, clock=lambda: T0, concurrency=3)
    keys = [("team-a", f"d{i}") for i in range(10)]

    async def all_finished() -> bool:
        return len(finished) == len(keys)

    try:
        for key in keys + keys[:4]:  # poked twice: refreshed once
            keeper.poke(key)
        await asyncio.wait_for(running.wait(), timeout=30)
        for _ in range(20):  # let every refresh that may start, start
            await asyncio.sleep(0)
        assert len(started) == 3  # the rest wait for a slot
        gate.set()
        await wait_for_async(all_finished, timeout=30, what="every refresh")
        assert sorted(finished) == sorted(keys)
    finally:
        await keeper.stop()
