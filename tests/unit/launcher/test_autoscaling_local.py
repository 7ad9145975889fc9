"""Local mode as an autoscaling driver: it observes (given load reports, real child processes, a
fake clock), runs the shared round and carries it out (files written, processes started and
stopped, a hot model loaded on a real HTTP server before a scale-down); and the replica's
pre-loading of the hot models (a real cache). The round's own choices: test_autoscaling_round.py."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from modelplex.cache import ModelCache
from modelplex.processes import free_port
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.load import ENV_PRELOAD_FILE, LoadReport, ReplicaLoad
from modelplex_launcher.local import LocalRun, plan
from modelplex_replica.preload import hot_models, preload_hot_models


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def local(tmp_path: Path):
    manifest = tmp_path / "scaled.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "scaled"},
        "spec": {"image": "local", "handler": "app:Model",
                 "autoscaling": {"minReplicas": 0, "maxReplicas": 3, "targetOngoingRequests": 2,
                                 "upscaleDelaySeconds": 0, "downscaleDelaySeconds": 0, "lookBackPeriodSeconds": 1}},
    }))
    run = LocalRun(plan([str(manifest)], host="127.0.0.1", port=free_port()), out=io.StringIO())
    for child in run.replicas:
        child.argv = ["sleep", "60"]  # a real process to start, signal and stop
    try:
        yield run
    finally:
        run.shutdown()


@contextmanager
def replica_server(port: int):
    """A replica's model-load endpoint on ``port``: the list gets (path, credential) of each call."""
    loads: list[tuple[str, str | None]] = []

    class Replica(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            loads.append((self.path, self.headers.get(INTERNAL_TOKEN_HEADER)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Replica)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield loads
    finally:
        server.shutdown()
        server.server_close()


def round_with(run: LocalRun, clock: FakeClock, report: LoadReport) -> None:
    scaler = run.scalers[0]
    scaler.autoscaler.clock = clock
    clock.now += 2.0  # past the 1 s look-back: the average is this report's load
    run._read_load = lambda plan: report
    run._scale(scaler)


def running(run: LocalRun) -> list[str]:
    return [c.name for c in run.replicas if c.wanted and c.running]


def test_local_mode_starts_at_zero_scales_from_a_held_request_and_stops_the_coldest_first(local):
    clock = FakeClock()
    scaler = local.scalers[0]
    assert [c.name for c in local.replicas] == ["scaled-0", "scaled-1", "scaled-2"]
    assert not any(c.wanted for c in local.replicas)  # minReplicas 0: nothing to start
    assert local.replicas[0].env[ENV_PRELOAD_FILE] == str(scaler.hot_models_file)

    slots = [ReplicaLoad(f"scaled-{i}", ready=False) for i in range(3)]
    round_with(local, clock, LoadReport("scaled", 0.0, queued=1, replicas=tuple(slots), model_rates={"m-hot": 0.5}))
    assert running(local) == ["scaled-0"]
    assert scaler.hot_models_file.read_text() == "m-hot\n"  # written before the replica started
    assert "0 -> 1 replica(s) (1 request(s) waiting at zero replicas): starting scaled-0" in local.out.getvalue()

    busy = LoadReport("scaled", 0.0, replicas=(ReplicaLoad("scaled-0", ongoing=6, models=("m-hot",)),),
                      model_rates={"m-hot": 2.0, "m-warm": 1.0})
    round_with(local, clock, busy)
    assert running(local) == ["scaled-0", "scaled-1", "scaled-2"]  # 6 ongoing at target 2

    # Two requests: one replica is enough. scaled-1 holds the least requested models.
    caches = LoadReport("scaled", 0.0, replicas=(
        ReplicaLoad("scaled-0", ongoing=1, models=("m-hot",)),
        ReplicaLoad("scaled-1", ongoing=0, models=("m-cold",)),
        ReplicaLoad("scaled-2", ongoing=1, models=("m-warm",))),
        model_rates={"m-hot": 2.0, "m-warm": 1.0, "m-cold": 0.01})
    with replica_server(local.plans[0].replica_ports[0]) as loads:
        round_with(local, clock, caches)
        # Before they stop, the hottest model only a leaving replica holds is loaded on the one
        # that stays (one: its capacity is unknown), with the deployment's own internal credential.
        assert running(local) == ["scaled-0", "scaled-1", "scaled-2"]
        assert scaler.preparing.result(timeout=30) == ("scaled-1", "scaled-2")
    assert loads == [("/v1/models/m-warm/load", local.token_of("scaled"))]
    assert running(local) == ["scaled-0", "scaled-1", "scaled-2"]
    local._scale(scaler)  # the next round stops them
    assert running(local) == ["scaled-0"]
    assert "before stopping scaled-1, scaled-2: m-warm -> scaled-0" in local.out.getvalue()
    stopped = [c for c in local.replicas if c.name != "scaled-0"]
    assert all(not c.wanted and c.kill_at is not None for c in stopped)
    assert "3 -> 1 replica(s)" in local.out.getvalue()
    assert "stopping scaled-1, scaled-2 (coldest cache first)" in local.out.getvalue()
    for child in stopped:
        assert child.proc.wait(timeout=10) != 0  # SIGTERM reached it


def test_local_mode_stops_one_replica_the_coldest(local):
    clock = FakeClock()
    round_with(local, clock, LoadReport("scaled", 0.0, replicas=(ReplicaLoad("scaled-0", ongoing=6),)))
    assert running(local) == ["scaled-0", "scaled-1", "scaled-2"]
    round_with(local, clock, LoadReport("scaled", 0.0, replicas=(
        ReplicaLoad("scaled-0", ongoing=2, models=("a",)),
        ReplicaLoad("scaled-1", ongoing=2, models=("b",)),
        ReplicaLoad("scaled-2", ongoing=0, models=("c",))),
        model_rates={"a": 0.1, "b": 3.0, "c": 1.0}))
    # a's 0.1/s is the coldest cache; a load of "a" elsewhere is tried first (nothing answers
    # there: it fails, and the replica stops all the same).
    assert local.scalers[0].preparing.result(timeout=30) == ("scaled-0",)
    assert "a -> scaled-2 (failed:" in local.out.getvalue()
    local._scale(local.scalers[0])
    assert running(local) == ["scaled-1", "scaled-2"]


def test_an_unreadable_report_changes_nothing(local):
    scaler = local.scalers[0]
    local._read_load = lambda plan: None
    local._scale(scaler)
    local._scale(scaler)
    assert running(local) == []
    assert local.out.getvalue().count("cannot read the router's load report") == 1


# -- the replica's pre-loading ----------------------------------------------------------------


async def test_a_replica_preloads_the_listed_models_it_has_room_for(tmp_path):
    loads = []

    async def load(model_id: str):
        loads.append(model_id)
        if model_id == "broken":
            raise RuntimeError("no such weights")
        return {"id": model_id}

    cache = ModelCache(load, capacity=3)
    await cache.get("prewarmed")
    listed = tmp_path / "hot-models"
    listed.write_text("prewarmed\nbroken\nhot-1\nhot-2\nhot-3\n")
    env = {ENV_PRELOAD_FILE: str(listed)}
    assert hot_models(env) == ["prewarmed", "broken", "hot-1", "hot-2", "hot-3"]
    await preload_hot_models(cache, env)
    # Room for two more: the first two listed that are not held yet (a failure only logs).
    assert loads == ["prewarmed", "broken", "hot-1"]
    assert sorted(cache.loaded) == ["hot-1", "prewarmed"]


async def test_no_preload_file_or_a_missing_one_loads_nothing(tmp_path):
    cache = ModelCache(lambda model_id: asyncio.sleep(0, model_id), capacity=2)
    assert hot_models({}) == []
    assert hot_models({ENV_PRELOAD_FILE: str(tmp_path / "absent")}) == []
    await preload_hot_models(cache, {ENV_PRELOAD_FILE: str(tmp_path / "absent")})
    assert cache.loaded == []
