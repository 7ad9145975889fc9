"""One deployment behind a real Envoy, for the package: two replicas of ``handlers:Models`` (real
torch models, ten per replica), a router whose Endpoint Picker Envoy asks (ext_proc, one
listener per body mode), router auth on (``bob`` may call only ``public-*``), and the
deployment's internal credential, so that replicas take only the picker's proofs."""

from __future__ import annotations

import json
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from modelplex.processes import wait_for
from modelplex.wire.credentials import ENV_CLIENT_TOKENS_DIR, ENV_INTERNAL_TOKEN_FILE, new_token, write_token_file

from support.envoy import Envoy, start_envoy
from support.servers import MODELPLEX, START_TIMEOUT_S, Proc, Processes, free_port

HERE = Path(__file__).resolve().parent
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}
REPLICAS = ("r0", "r1")


@dataclass
class Gateway:
    envoy: Envoy
    router_url: str
    picker: str
    #: Each replica's ``ip:port``, by its name.
    replicas: dict[str, str]
    router: Proc
    processes: Processes
    #: The deployment's internal credential (the router's routing table is for its components).
    internal_token: str
    #: The router's control port: its ``/metrics``.
    control_url: str

    def url(self, mode: str) -> str:
        return self.envoy.urls[mode]


@pytest.fixture(scope="package")
def gateway(tmp_path_factory) -> Iterator[Gateway]:
    processes = Processes(tmp_path_factory.mktemp("gateway"))
    try:
        yield _start(processes)
    finally:
        processes.stop_all()


def _start(processes: Processes) -> Gateway:
    folder = processes.folder
    shutil.copy(HERE / "handlers.py", folder / "handlers.py")
    clients = folder / "clients"
    clients.mkdir()
    for name, token in TOKENS.items():
        (clients / name).write_text(token)
    token = new_token()
    internal = write_token_file(folder / "internal", token)
    manifest = folder / "zoo.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "zoo"},
        "spec": {"replicas": 2, "image": "local", "handler": "handlers:Models", "maxOngoingRequests": 16,
                 "multiplexing": {"maxModelsPerReplica": 10},
                 "router": {"auth": {"secretRef": {"name": "zoo-clients"}, "models": {"bob": ["public-*"]}},
                            "endpointPicker": {"enabled": True}}}}))
    env = {ENV_INTERNAL_TOKEN_FILE: str(internal)}
    replicas = {}
    for name in REPLICAS:
        port = free_port()
        processes.replica(manifest, port, name=f"replica-{name}", env={**env, "TEST_REPLICA": name})
        replicas[name] = f"127.0.0.1:{port}"
    router_port, picker_port, control_port = free_port(), free_port(), free_port()
    argv = [*MODELPLEX, "router", "--spec", str(manifest), "--host", "127.0.0.1", "--port", str(router_port),
            "--control-port", str(control_port), "--picker-port", str(picker_port)]
    for name, address in replicas.items():
        argv += ["--replica", f"{name}=http://{address}"]
    router = processes.start("router", argv, {**env, ENV_CLIENT_TOKENS_DIR: str(clients)},
                             url=f"http://127.0.0.1:{router_port}")

    def ready() -> bool:
        with urllib.request.urlopen(router.url + "/readyz", timeout=5) as answer:
            return json.load(answer)["ready_replicas"] == len(REPLICAS)

    def running() -> None:
        for proc in processes.procs:
            proc.check_running()

    wait_for(ready, START_TIMEOUT_S, 0.2, "the router to see both replicas ready", guard=running)
    envoy = start_envoy(processes, picker_port)
    return Gateway(envoy, router.url, f"127.0.0.1:{picker_port}", replicas, router, processes, token,
                   f"http://127.0.0.1:{control_port}")
