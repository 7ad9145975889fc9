"""One deployment behind a real Envoy, for the Gateway tests (``tests/integration/gateway``): two
replicas of its ``handlers:Models`` (real torch models, ten per replica), a router whose
Endpoint Picker Envoy asks (ext_proc), router auth on (``bob`` may call only ``public-*``), and
the deployment's internal credential, so that replicas take only the picker's proofs. The picker
names one fallback after each pick (``fallbacks: 1``), which an Envoy on ``ORIGINAL_DST`` (the
header's one pick) ignores and one on the override-host policy tries."""

from __future__ import annotations

import json
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelplex.processes import wait_for
from modelplex.wire.credentials import ENV_CLIENT_TOKENS_DIR, ENV_INTERNAL_TOKEN_FILE, new_token, write_token_file

from support.envoy import Envoy, start_envoy
from support.servers import MODELPLEX, START_TIMEOUT_S, Proc, Processes, free_port

HANDLERS = Path(__file__).resolve().parents[1] / "integration" / "gateway" / "handlers.py"
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789", "carol": "carol-token-0123456789"}
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
    #: Each replica's process, by its name.
    replica_procs: dict[str, Proc]

    def url(self, mode: str) -> str:
        return self.envoy.urls[mode]


def start_stack(processes: Processes, *, router_spec: dict[str, Any] | None = None, router_env: dict[str, str] | None = None,
           **envoy: Any) -> Gateway:
    """The stack, with ``router_spec`` over the router's spec here, ``router_env`` in the router's
    environment, and ``envoy`` passed to :func:`~support.envoy.start_envoy` (with the replicas'
    endpoints as ``endpoints``). The router starts once the replicas are ready, so that its first
    poll finds them (however long its poll interval)."""
    folder = processes.folder
    shutil.copy(HANDLERS, folder / "handlers.py")
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
                            "endpointPicker": {"enabled": True, "fallbacks": 1}, **(router_spec or {})}}}))
    env = {ENV_INTERNAL_TOKEN_FILE: str(internal)}
    replicas, replica_procs = {}, {}
    for name in REPLICAS:
        port = free_port()
        replica_procs[name] = processes.replica(manifest, port, name=f"replica-{name}",
                                                env={**env, "TEST_REPLICA": name})
        replicas[name] = f"127.0.0.1:{port}"
    def replicas_ready() -> bool:
        for address in replicas.values():
            with urllib.request.urlopen(f"http://{address}/readyz", timeout=5) as answer:
                if answer.status != 200:
                    return False
        return True

    wait_for(replicas_ready, START_TIMEOUT_S, 0.2, "both replicas ready",
             guard=lambda: [proc.check_running() for proc in replica_procs.values()])
    router_port, picker_port, control_port = free_port(), free_port(), free_port()
    argv = [*MODELPLEX, "router", "--spec", str(manifest), "--host", "127.0.0.1", "--port", str(router_port),
            "--control-port", str(control_port), "--picker-port", str(picker_port)]
    for name, address in replicas.items():
        argv += ["--replica", f"{name}=http://{address}"]
    router = processes.start("router", argv, {**env, ENV_CLIENT_TOKENS_DIR: str(clients), **(router_env or {})},
                             url=f"http://127.0.0.1:{router_port}")

    def ready() -> bool:
        with urllib.request.urlopen(router.url + "/readyz", timeout=5) as answer:
            return json.load(answer)["ready_replicas"] == len(REPLICAS)

    def running() -> None:
        for proc in processes.procs:
            proc.check_running()

    wait_for(ready, START_TIMEOUT_S, 0.2, "the router to see both replicas ready", guard=running)
    if envoy.get("load_balancing") == "override_host":
        envoy["endpoints"] = tuple(replicas.values())
    started = start_envoy(processes, picker_port, **envoy)
    return Gateway(started, router.url, f"127.0.0.1:{picker_port}", replicas, router, processes, token,
                   f"http://127.0.0.1:{control_port}", replica_procs)
