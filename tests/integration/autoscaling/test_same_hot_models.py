"""Local mode and the operator pre-load the same hot models for the same handler.

One handler with 10 model slots (its ``@multiplexed``; the spec does not say), run by
``modelplex local`` (real router and replica processes) and sent requests for 6 models. Local
mode writes the file its new replicas pre-load; the operator's autoscaler, run against a real
Kubernetes API server (the project's control plane without a node), reads the same router's
load report (a router pod object whose IP is the local router's address) and writes the
hot-models ConfigMap. Both lists are the same, as long as the one rule says
(``min(capacity, MAX_PRELOAD_MODELS)``): before, local mode listed 6 (the handler's 10 slots)
and the operator 3 (the spec's default)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from kubernetes import client as k8s
from kubernetes import config

from modelplex.autoscaling import MAX_PRELOAD_MODELS
from modelplex.processes import wait_for
from modelplex.wire.credentials import TokenFile
from modelplex.wire.load import ENV_PRELOAD_FILE, parse_hot_models
from modelplex.wire.names import (API_GROUP, API_VERSION, LABEL_DEPLOYMENT, LABEL_ROLE, MODEL_ID_HEADER, PLURAL,
                                  ROLE_ROUTER)
from modelplex_cluster.controlplane import ControlPlane, build_binaries
from modelplex_operator import builders
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers.autoscale import AutoscaleLoop
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.observe import resource_view
from modelplex_operator.kube import Kube

from support.servers import MODELPLEX, Processes, descendants, free_port, wait_until

NS = "default"
NAME = "tenslots"
SLOTS = 10
#: Requests per model: each model's rate differs, so the hottest are the same to both drivers.
REQUESTS = {f"m{i}": 6 - i for i in range(6)}
HANDLER = f'''
from modelplex import get_multiplexed_model_id, multiplexed


class TenSlots:
    @multiplexed(max_num_models_per_replica={SLOTS})
    async def load_model(self, model_id: str):
        return {{"id": model_id}}

    async def __call__(self, body):
        model = await self.load_model(get_multiplexed_model_id())
        return {{"model": model["id"]}}
'''


def manifest(folder: Path, router_port: int) -> dict:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "MultiplexedDeployment",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"image": "local", "handler": "tenslots:TenSlots",
                 "router": {"replicas": 1, "port": router_port},
                 # One replica throughout: long delays, a target no test load reaches.
                 "autoscaling": {"minReplicas": 1, "maxReplicas": 2, "targetOngoingRequests": 100,
                                 "upscaleDelaySeconds": 600, "downscaleDelaySeconds": 600}},
    }


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(build_binaries(quiet=True), state_dir=tmp_path_factory.mktemp("control-plane"), node=False)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


def preload_file(local_pid: int) -> Path | None:
    """The pre-load file local mode gives its replicas (from a replica process's environment)."""
    for pid in descendants(local_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"replica" in argv:
            for entry in environ:
                if entry.startswith(f"{ENV_PRELOAD_FILE}=".encode()):
                    return Path(entry.split(b"=", 1)[1].decode())
    return None


def router_pod_at(api: k8s.ApiClient, ip: str) -> None:
    """A router pod object of the deployment, running at ``ip`` as far as the API server says."""
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod(NS, {"metadata": {"name": f"{NAME}-router-1", "labels": {
        LABEL_DEPLOYMENT: NAME, LABEL_ROLE: ROLE_ROUTER}}, "spec": {"containers": [{"name": "router", "image": "none"}]}})
    core.patch_namespaced_pod_status(f"{NAME}-router-1", NS, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})


async def test_local_mode_and_the_operator_list_the_same_hot_models_for_a_handler_with_ten_slots(
        processes: Processes, tmp_path: Path, control_plane: ControlPlane):
    (tmp_path / "tenslots.py").write_text(HANDLER)
    port = free_port()
    path = tmp_path / "tenslots.yaml"
    path.write_text(json.dumps(manifest(tmp_path, port)))
    local = processes.start("local", [*MODELPLEX, "local", str(path), "--port", str(port)])

    async def output_has(text: str) -> bool:
        local.check_running()
        return text in local.log.read_text(errors="replace")

    await wait_until(lambda: output_has("Press Ctrl-C"), timeout=120, what="modelplex local to start")
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for model, count in REQUESTS.items():
            for _ in range(count):
                async with session.post(url + "/", json={}, headers={MODEL_ID_HEADER: model}) as answer:
                    assert answer.status == 200 and (await answer.json()) == {"model": model}

        async def capacity_known() -> bool:
            async with session.get(url + "/v1/load") as answer:
                return any(r["capacity"] == SLOTS for r in (await answer.json())["replicas"])
        await wait_until(capacity_known, timeout=30, interval=0.2, what="the router to know the replica's capacity")

    expected = min(SLOTS, MAX_PRELOAD_MODELS)
    hottest = list(REQUESTS)[:expected]

    async def local_listed() -> list[str] | None:
        found = preload_file(local.popen.pid)
        listed = parse_hot_models(found.read_text()) if found is not None and found.exists() else []
        return listed if listed == hottest else None
    # Rewritten by a round (every 2 s) once the router knows the capacity.
    local_list = await wait_until(local_listed, timeout=30, interval=0.2,
                                  what=f"local mode's pre-load file to list {hottest}")

    # The operator, reading the same router through a router pod object at its address.
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    control_plane.kubectl("apply", "-f", str(Path(__file__).parents[3] / "crds" / "multiplexeddeployments.modelplex.io.yaml"))
    custom = k8s.CustomObjectsApi(api)
    made = wait_for(lambda: custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL,
                                                                   manifest(tmp_path, port)),
                    60, 0.5, "the CRD served", retry_on=(Exception,))
    router_pod_at(api, "127.0.0.1")
    ctx = OperatorContext(config=OperatorConfig(), kube=Kube(api))
    # Local mode's routers answer their run's internal credential: the operator sends it as the
    # deployment's own (a reconcile would have read it from the deployment's Secret).
    internal = next(line.split(": ", 1)[1].split()[0] for line in local.log.read_text().splitlines()
                    if line.startswith("internal credential: "))
    token = TokenFile(Path(internal)).token()
    assert token
    ctx.credentials.remember((NS, NAME), {"data": {"token": base64.b64encode(token.encode()).decode()}})
    ctx.scaled[(NS, NAME)] = 1
    loop = AutoscaleLoop(ctx)
    try:
        decision = await loop.round((NS, NAME), resource_view(made))
    finally:
        await loop.stop()
        await ctx.pods.close()
    assert decision is not None and decision.desired == 1, ctx.autoscaling.get((NS, NAME))
    written = k8s.CoreV1Api(api).read_namespaced_config_map(builders.hot_models_config_map_name(NAME), NS)
    operator_list = parse_hot_models(written.data[builders.HOT_MODELS_FILE])
    assert operator_list == local_list == hottest
    assert len(operator_list) == expected == 4
