"""Discovery: pod events to routing-table events (plain dicts), and static replica lists."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from modelplex.processes import free_port
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.names import ANNOTATION_LOADED_MODELS
from modelplex_router.discovery.kubernetes import Gone, PodTracker, apply_all, replica_from_pod, selector
from modelplex_router.discovery.static import StaticDiscovery, parse_replica_arg
from modelplex_router.events import DocumentFetched, ReplicaSeen
from modelplex_router.table import RoutingTable


def pod(name, ip="10.0.0.5", ready=True, version=None, rv="7", deleting=False, port=None, raw_annotation=None):
    meta = {"name": name, "resourceVersion": rv, "labels": {"modelplex.io/deployment": "recs"}}
    if version is not None:
        meta["annotations"] = {ANNOTATION_LOADED_MODELS: json.dumps(
            {"version": version, "models": 2, "loading": 0, "capacity": 3, "bytes": 0, "capacityBytes": 0})}
    if raw_annotation is not None:
        meta["annotations"] = {ANNOTATION_LOADED_MODELS: raw_annotation}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    status = {"conditions": [{"type": "PodScheduled", "status": "True"},
                             {"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    spec = {"containers": [{"name": "replica", "ports": [{"name": "http", "containerPort": port}]}]} if port else {}
    return {"metadata": meta, "status": status, "spec": spec}


def test_the_selector_names_the_deployment_and_the_replica_role():
    assert selector("recs") == "modelplex.io/deployment=recs,modelplex.io/role=replica"


def test_a_ready_pod_with_its_annotation_is_a_ready_replica_whose_models_are_to_fetch():
    info = replica_from_pod(pod("recs-1", version=4))
    assert info.name == "recs-1"
    assert info.url == "http://10.0.0.5:9000"
    assert info.ready
    # The annotation is a summary: the version says there is a document to fetch, no list.
    assert info.held.document is None and info.held.summary.capacity == 3 and info.held.summary.version == 4


@pytest.mark.parametrize(
    "kwargs",
    [{"ready": False}, {"ip": None}, {"deleting": True}],
    ids=["not-ready", "no-ip-yet", "terminating"],
)
def test_pods_that_must_get_no_traffic_are_not_ready(kwargs):
    assert not replica_from_pod(pod("recs-1", **kwargs)).ready


def test_the_port_comes_from_the_http_container_port_and_ipv6_is_bracketed():
    assert replica_from_pod(pod("p", port=9100)).url == "http://10.0.0.5:9100"
    assert replica_from_pod(pod("p", ip="fd00::5")).url == "http://[fd00::5]:9000"


def test_a_malformed_annotation_reads_as_nothing_to_fetch():
    assert replica_from_pod(pod("p", raw_annotation="{not json")).held.summary.version == 0
    assert replica_from_pod(pod("p", raw_annotation='["a"]')).held.summary.version == 0
    assert replica_from_pod(pod("p", raw_annotation='{"version": "x"}')).held.summary.version == 0
    assert replica_from_pod(pod("p")).held.summary.version == 0  # no annotation yet


def test_list_then_events_drive_the_table():
    tracker = PodTracker()
    table = RoutingTable(lag_s=1.0)
    ops = tracker.on_list({"metadata": {"resourceVersion": "100"},
                           "items": [pod("r1", version=4), pod("r2", ip="10.0.0.6", ready=False)]})
    apply_all(table, ops, 1.0)
    assert tracker.resource_version == "100"
    assert [r.name for r in table.usable(1.0)] == ["r1"]
    assert [r.name for r in table.stale_replicas()] == ["r1"]  # its document is to fetch

    modified = pod("r2", ip="10.0.0.6", version=1, rv="101")
    apply_all(table, tracker.on_event({"type": "MODIFIED", "object": modified}), 2.0)
    assert tracker.resource_version == "101"
    assert sorted(r.name for r in table.usable(2.0)) == ["r1", "r2"]

    apply_all(table, tracker.on_event({"type": "DELETED", "object": pod("r1", rv="103")}), 4.0)
    assert [r.name for r in table.replicas()] == ["r2"]

    apply_all(table, tracker.on_event({"type": "ADDED", "object": pod("r3", ip="10.0.0.7", rv="104")}), 5.0)
    assert sorted(r.name for r in table.replicas()) == ["r2", "r3"]
    assert tracker.resource_version == "104"


def test_a_fetched_document_stays_until_a_summary_announces_a_newer_one():
    table = RoutingTable()
    apply_all(table, PodTracker().on_list({"metadata": {}, "items": [pod("r1", version=2)]}), 1.0)
    table.apply(DocumentFetched("r1", LoadedModels(version=2, capacity=3, models=("a", "b"))), 1.5)
    assert table.get("r1").models == {"a", "b"} and not table.stale_replicas()
    apply_all(table, PodTracker().on_event({"type": "MODIFIED", "object": pod("r1", version=2)}), 2.0)
    assert table.get("r1").models == {"a", "b"} and not table.stale_replicas()
    apply_all(table, PodTracker().on_event({"type": "MODIFIED", "object": pod("r1", version=3)}), 3.0)
    assert table.get("r1").models == {"a", "b"}  # what it knows, until the fetch
    assert [r.name for r in table.stale_replicas()] == ["r1"]


def test_the_raw_object_of_the_kubernetes_client_is_used_when_present():
    tracker = PodTracker()
    ops = tracker.on_event({"type": "ADDED", "object": object(), "raw_object": pod("r1", version=6, rv="9")})
    assert isinstance(ops[0], ReplicaSeen) and ops[0].held.summary.version == 6
    assert tracker.resource_version == "9"


def test_a_bookmark_only_moves_the_resource_version():
    tracker = PodTracker()
    assert tracker.on_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "555"}}}) == []
    assert tracker.resource_version == "555"


def test_410_gone_asks_for_a_new_list():
    tracker = PodTracker()
    tracker.on_list({"metadata": {"resourceVersion": "1"}, "items": []})
    with pytest.raises(Gone):
        tracker.on_event({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})
    assert tracker.resource_version is None


def test_other_watch_errors_raise_and_keep_the_resource_version():
    tracker = PodTracker()
    tracker.on_list({"metadata": {"resourceVersion": "5"}, "items": []})
    with pytest.raises(RuntimeError):
        tracker.on_event({"type": "ERROR", "object": {"kind": "Status", "code": 500}})
    assert tracker.resource_version == "5"  # the watch resumes from here


def test_a_relist_replaces_the_table():
    tracker = PodTracker()
    table = RoutingTable()
    apply_all(table, tracker.on_list({"metadata": {"resourceVersion": "1"}, "items": [pod("r1"), pod("r2")]}), 1.0)
    apply_all(table, tracker.on_list({"metadata": {"resourceVersion": "9"}, "items": [pod("r2")]}), 2.0)
    assert [r.name for r in table.replicas()] == ["r2"]


# -- static ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arg, expected",
    [
        ("http://127.0.0.1:9001", ("127.0.0.1:9001", "http://127.0.0.1:9001")),
        ("127.0.0.1:9001/", ("127.0.0.1:9001", "http://127.0.0.1:9001")),
        ("recs-0=http://127.0.0.1:9001", ("recs-0", "http://127.0.0.1:9001")),
    ],
)
def test_replica_arguments(arg, expected):
    assert parse_replica_arg(arg) == expected


@pytest.mark.parametrize("arg", ["http://127.0.0.1", "ftp://h:1", "x="])
def test_bad_replica_arguments_are_refused(arg):
    with pytest.raises(ValueError):
        parse_replica_arg(arg)


def test_static_replica_names_must_be_distinct():
    with pytest.raises(ValueError):
        StaticDiscovery(["a=http://127.0.0.1:1", "a=http://127.0.0.1:2"])


async def test_a_replica_that_turns_ready_is_first_seen_with_the_models_it_preloaded():
    # A replica turns ready once its pre-loaded models are published. This one turns ready just
    # after answering a model list (if one is asked for within 0.2 s): a poll must not pair that
    # older, empty list with the ready answer.
    replica = {"ready": False, "models": LoadedModels(version=1, capacity=4)}
    models_asked = asyncio.Event()

    async def models(request):
        answer = web.json_response(replica["models"].to_dict())
        models_asked.set()
        return answer

    async def readyz(request):
        if not replica["ready"]:
            try:
                await asyncio.wait_for(models_asked.wait(), 0.2)
            except TimeoutError:
                pass
            replica.update(ready=True, models=LoadedModels(version=2, capacity=4, models=("preloaded",)))
        return web.Response(status=200 if replica["ready"] else 503)

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.get("/readyz", readyz)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    table = RoutingTable(lag_s=0.0)
    polling = asyncio.create_task(StaticDiscovery([f"r=http://127.0.0.1:{port}"], interval_s=0.05).run(table, time.monotonic))
    try:
        deadline = time.monotonic() + 10
        while not table.usable(time.monotonic()) and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        (first_seen,) = table.usable(time.monotonic())
        assert first_seen.all_models() == {"preloaded"}
    finally:
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
        await runner.cleanup()
