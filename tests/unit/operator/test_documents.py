"""The operator's reading of replica documents: when it reads, what it keeps when a read
fails, and the rate-limited ModelLoadFailed Events. Pure parts first, then real aiohttp
replicas on loopback addresses (127.0.0.1, 127.0.0.2, ... on one port, as pods on one port)."""

from __future__ import annotations

import asyncio
import functools
import socket

import kopf
import pytest
from aiohttp import web

from modelplex.wire.loaded import LoadedModels, LoadedSummary, LoadFailure
from modelplex_operator.documents import (FAILURE_EVENT_INTERVAL_S, EventLimiter, ReplicaDocuments, _Known,
                                          new_failures, wants_read)
from modelplex_operator.status import PodView

KEY = ("team-a", "recs")
T0 = "2026-01-01T00:00:00Z"


def pod(name="a", version=1, ready=True, ip="10.0.0.1", deleting=False):
    return PodView(name, ready, deleting, LoadedSummary(version=version), ip)


def failure(model, count=1, at=T0, error="weights are corrupt"):
    return LoadFailure(model, error, at, count)


# --------------------------------------------------------------------------- when to read


def test_a_pod_is_read_when_its_summary_announces_a_newer_version_or_went_back():
    known = _Known(document=LoadedModels(version=5), summary_version=4)
    assert wants_read(pod(), None, 0)  # never read
    assert not wants_read(pod(version=5), known, 0)  # what it read already (the summary lagged)
    assert wants_read(pod(version=6), known, 0)
    assert wants_read(pod(version=1), known, 0)  # the replica restarted: its versions start again
    assert not wants_read(pod(version=6, ready=False), known, 0)
    assert not wants_read(pod(version=6, ip=""), known, 0)
    assert not wants_read(pod(version=6, deleting=True), known, 0)
    failed = _Known(document=LoadedModels(version=5), summary_version=5, error="timeout", retry_at=10.0)
    assert not wants_read(pod(version=6), failed, 9.9)  # a failed read waits for its pause
    assert wants_read(pod(version=6), failed, 10.0)


def test_new_failures_are_the_ones_whose_count_grew():
    before = LoadedModels(version=3, failures=(failure("x", 2), failure("y", 1)))
    after = LoadedModels(version=5, failures=(failure("y", 1), failure("x", 5), failure("z", 1)))
    assert [(f.model, times) for f, times in new_failures(before, after, T0)] == [("x", 3), ("z", 1)]
    assert new_failures(after, after, T0) == []


def test_a_first_read_reports_only_recent_failures():
    after = LoadedModels(version=5, failures=(failure("old", at="2025-12-31T23:00:00Z"), failure("new")))
    assert [f.model for f, _ in new_failures(None, after, not_before="2025-12-31T23:55:00Z")] == ["new"]
    # A replica that restarted (its version went back) counts again from what it reports now.
    before = LoadedModels(version=40, failures=(failure("new", count=7),))
    assert [(f.model, t) for f, t in new_failures(before, after, "2025-12-31T23:55:00Z")] == [("new", 1)]


def test_at_most_one_event_per_model_per_interval_with_the_held_back_counted():
    limiter = EventLimiter()
    assert limiter.admit(KEY, "x", 0.0) == 0
    assert limiter.admit(KEY, "x", 10.0) is None
    assert limiter.admit(KEY, "x", FAILURE_EVENT_INTERVAL_S - 1, times=3) is None
    assert limiter.admit(KEY, "y", 20.0) == 0  # another model has its own allowance
    assert limiter.admit(("team-b", "recs"), "x", 20.0) == 0  # and another resource
    assert limiter.admit(KEY, "x", FAILURE_EVENT_INTERVAL_S) == 4  # four held back since the first
    assert limiter.admit(KEY, "x", FAILURE_EVENT_INTERVAL_S + 1) is None
    limiter.forget(KEY)
    assert limiter.admit(KEY, "x", FAILURE_EVENT_INTERVAL_S + 2) == 0


# --------------------------------------------------------------------------- real replicas on loopback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeReplica:
    """A replica's ``GET /v1/models`` on its own loopback address: a real aiohttp server."""

    def __init__(self, ip: str, document: LoadedModels):
        self.ip = ip
        self.document = document
        self.requests = 0
        self.hang = False
        self.released = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def models(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.hang:
            await self.released.wait()
        return web.json_response(self.document.to_dict())

    async def start(self, port: int) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.ip, port).start()

    async def stop(self) -> None:
        self.released.set()
        await self.runner.cleanup()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def pool():
    port = free_port()
    replicas = {
        "recs-replica-a": FakeReplica("127.0.0.1", LoadedModels(version=2, models=("m1", "m2"),
                                                                 model_bytes={"m1": 100, "m2": 300})),
        "recs-replica-b": FakeReplica("127.0.0.2", LoadedModels(version=1, models=("m1",), model_bytes={"m1": 100})),
    }
    for replica in replicas.values():
        await replica.start(port)
    clock = Clock()
    reader = ReplicaDocuments(port=port, timeout_s=0.5, clock=clock, wall_clock=lambda: 1_767_225_600.0)
    try:
        yield replicas, reader, clock
    finally:
        await reader.close()
        for replica in replicas.values():
            await replica.stop()


def views(replicas, **versions):
    return [PodView(name, True, False, LoadedSummary(version=versions.get(name[-1], r.document.version)), r.ip)
            for name, r in replicas.items()]


async def test_documents_are_read_only_when_a_summary_announces_a_newer_version(pool):
    replicas, reader, _ = pool
    reading = await reader.read(KEY, views(replicas))
    assert reading.documents == {name: r.document for name, r in replicas.items()}
    assert reading.unreported == {} and reading.events == [] and reading.retry_in is None
    await reader.read(KEY, views(replicas))  # nothing changed: nothing fetched
    assert [r.requests for r in replicas.values()] == [1, 1]

    a = replicas["recs-replica-a"]
    a.document = LoadedModels(version=3, models=("m2",), model_bytes={"m2": 300})
    reading = await reader.read(KEY, views(replicas))
    assert [r.requests for r in replicas.values()] == [2, 1]  # only the pod whose summary moved
    assert reading.documents["recs-replica-a"].models == ("m2",)

    # A pod that is gone is forgotten.
    reading = await reader.read(KEY, views(replicas)[:1])
    assert set(reading.documents) == {"recs-replica-a"}


async def test_a_replica_that_does_not_answer_keeps_its_last_known_models_and_is_retried_later(pool):
    replicas, reader, clock = pool
    await reader.read(KEY, views(replicas))
    b = replicas["recs-replica-b"]
    b.hang = True
    b.document = LoadedModels(version=2, models=("m1", "m3"))
    reading = await reader.read(KEY, views(replicas))
    assert reading.documents["recs-replica-b"].models == ("m1",)  # the last known
    assert "no answer within 0.5 s" in reading.unreported["recs-replica-b"]
    assert reading.retry_in == 2.0
    assert b.requests == 2

    # Within its pause it is not tried again, however often the keeper asks.
    clock.now += 1.0
    reading = await reader.read(KEY, views(replicas))
    assert b.requests == 2 and reading.retry_in is None and "recs-replica-b" in reading.unreported
    clock.now += 1.0
    b.hang = False
    reading = await reader.read(KEY, views(replicas))
    assert b.requests == 3 and reading.unreported == {}
    assert reading.documents["recs-replica-b"].models == ("m1", "m3")


async def test_load_failures_become_one_warning_event_per_model_despite_repeats(pool):
    replicas, reader, clock = pool
    await reader.read(KEY, views(replicas))
    a = replicas["recs-replica-a"]
    a.document = LoadedModels(version=3, models=("m1",), failures=(failure("broken", error="no such file"),))
    reading = await reader.read(KEY, views(replicas))
    assert reading.events == [("Warning", "ModelLoadFailed",
                               "model 'broken' failed to load on replica recs-replica-a: no such file")]
    # It fails again on both replicas within five minutes: no Event, but the failures are counted.
    for version, count in ((4, 2), (5, 3)):
        clock.now += 60
        a.document = LoadedModels(version=version, failures=(failure("broken", count),))
        assert (await reader.read(KEY, views(replicas))).events == []
    replicas["recs-replica-b"].document = LoadedModels(version=2, failures=(failure("broken"),))
    assert (await reader.read(KEY, views(replicas))).events == []
    # Five minutes after the Event, the next failure is news again, with what was held back.
    clock.now += FAILURE_EVENT_INTERVAL_S
    a.document = LoadedModels(version=6, failures=(failure("broken", 4),))
    (event,) = (await reader.read(KEY, views(replicas))).events
    assert event[1] == "ModelLoadFailed" and "'broken'" in event[2]
    assert "3 more failed loads of it since the last Event" in event[2]


async def test_a_replica_answering_nonsense_is_reported_not_trusted(pool):
    replicas, reader, _ = pool
    a = replicas["recs-replica-a"]

    async def nonsense(request):
        return web.json_response({"models": 5})

    await a.stop()
    app = web.Application()
    app.router.add_get("/v1/models", nonsense)
    a.runner = web.AppRunner(app)
    await a.runner.setup()
    await web.TCPSite(a.runner, a.ip, reader.port).start()
    reading = await reader.read(KEY, views(replicas))
    assert "malformed document" in reading.unreported["recs-replica-a"]
    assert set(reading.documents) == {"recs-replica-b"}


async def test_the_status_keeper_writes_the_models_and_posts_the_failure_event(pool, monkeypatch):
    from unit.operator.objects import body

    from modelplex_operator.config import OperatorConfig
    from modelplex_operator.handlers import keeper as keeper_module
    from modelplex_operator.handlers import reconcile
    from modelplex_operator.handlers.context import OperatorContext
    from modelplex_operator.handlers.observe import Indexes, resource_view

    class StatusWrites:
        """The one API call the keeper makes here, recorded (the e2e suite has the real API)."""

        def __init__(self):
            self.written = []

        async def apatch_status(self, namespace, name, uid, status):
            self.written.append(status)

    posted = []
    monkeypatch.setattr(kopf, "event", lambda obj, type, reason, message: posted.append(
        (obj["metadata"]["name"], type, reason, message)))
    replicas, reader, _ = pool
    replicas["recs-replica-b"].document = LoadedModels(version=1, models=("m1",), model_bytes={"m1": 100},
                                                       failures=(failure("broken"),))
    ctx = OperatorContext(config=OperatorConfig(), kube=StatusWrites())
    keeper = keeper_module.StatusKeeper(ctx, functools.partial(reconcile.repair, ctx), documents=reader)
    ctx.indexes = Indexes(resources={KEY: [resource_view(body())]}, pods={KEY: views(replicas)}, deployments={})

    status = await keeper.refresh(KEY)
    assert ctx.kube.written == [status]
    assert status["models"] == [
        {"name": "m1", "copies": 2, "bytes": 100, "replicas": ["recs-replica-a", "recs-replica-b"]},
        {"name": "m2", "copies": 1, "bytes": 300, "replicas": ["recs-replica-a"]},
    ]
    assert posted == [("recs", "Warning", "ModelLoadFailed",
                       "model 'broken' failed to load on replica recs-replica-b: weights are corrupt")]
    # Nothing changed: no fetch, no write, no Event.
    assert await keeper.refresh(KEY) is None
    assert [r.requests for r in replicas.values()] == [1, 1] and len(posted) == 1
    await keeper.stop()


def test_failures_of_many_models_in_one_round_are_one_event_per_reason():
    from modelplex_operator.documents import EVENT_MESSAGE_CHARS, aggregate_events

    events = [("Warning", "ModelLoadFailed", f"model 'ghost-{i}' failed to load on replica r: not found")
              for i in range(20)]
    (event,) = aggregate_events(events)
    assert event[:2] == ("Warning", "ModelLoadFailed")
    assert event[2].startswith("20 models failed to load: model 'ghost-0'") and len(event[2]) <= EVENT_MESSAGE_CHARS
    single = [("Warning", "ModelLoadFailed", "model 'm' failed to load on replica r: boom")]
    assert aggregate_events(single) == single
    assert aggregate_events([]) == []
