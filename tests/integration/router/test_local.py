"""``modelplex local``: whole deployments as local processes, stopped without leftovers."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from pathlib import Path

import aiohttp

from modelplex.processes import consecutive_free_ports
from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import MODELPLEX, descendants

TIMEOUT = aiohttp.ClientTimeout(total=60)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def wait_for_output(plex, proc, text: str) -> str:
    async def seen():
        assert proc.alive(), f"modelplex local exited early:\n{proc.tail(80)}"
        output = proc.log.read_text(errors="replace")
        return output if text in output else ""
    return await plex.wait_until(seen, timeout=120, interval=0.1, what=f"{text!r} in the output")


def manifests(folder: Path, names: list[str]) -> Path:
    documents = []
    for name in names:
        documents.append(json.dumps({
            "apiVersion": "modelplex.io/v1alpha1",
            "kind": "MultiplexedDeployment",
            "metadata": {"name": name, "annotations": {"modelplex.io/example-request": '{"hello": "world"}'}},
            "spec": {"replicas": 1, "image": "local", "handler": "handlers:Echo",
                     "multiplexing": {"maxModelsPerReplica": 2, "prewarm": ["model-01"]}},
        }))
    path = folder / "deployments.yaml"
    path.write_text("\n---\n".join(documents))
    return path


async def test_local_runs_two_deployments_and_ctrl_c_stops_everything(plex):
    plex.write_manifest()  # copies handlers.py beside the manifests
    manifest = manifests(plex.folder, ["alpha", "beta-two"])
    port = consecutive_free_ports(2)
    local = plex.processes.start("local", [*MODELPLEX, "local", str(manifest), "--port", str(port)])
    output = await wait_for_output(plex, local, "Press Ctrl-C")

    alpha, beta = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    assert f"alpha is ready at {alpha}" in output
    assert f"beta-two is ready at {beta}" in output
    curl = next(line for line in output.splitlines() if line.strip().startswith("curl -s --json"))
    words = shlex.split(curl)
    body = json.loads(words[words.index("--json") + 1])
    header_name, _, model = words[words.index("-H") + 1].partition(": ")
    assert header_name == MODEL_ID_HEADER and words[-1] == alpha + "/"

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(words[-1], json=body, headers={header_name: model}) as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert answer["model"] == model and answer["echo"] == body
        # Every child knows every deployment's router by name.
        assert answer["env"] == {"MODELPLEX_ROUTER_ALPHA": alpha, "MODELPLEX_ROUTER_BETA_TWO": beta}
        async with session.post(beta + "/v1/models/b1/predict", json={}) as resp:
            assert resp.status == 200
            assert (await resp.json())["model"] == "b1"

    children = descendants(local.popen.pid)
    assert len(children) == 4, children  # two replicas, two routers
    os.kill(local.popen.pid, signal.SIGINT)  # what Ctrl-C sends (the children have their own group)
    assert local.popen.wait(timeout=60) == 0
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)]
    assert "stopping" in local.log.read_text()


async def test_local_sigterm_stops_everything_and_restarts_a_crashed_replica(plex):
    plex.write_manifest()
    manifest = manifests(plex.folder, ["solo"])
    port = consecutive_free_ports(2)
    local = plex.processes.start("local", [*MODELPLEX, "local", str(manifest), "--port", str(port)])
    await wait_for_output(plex, local, "Press Ctrl-C")
    url = f"http://127.0.0.1:{port}"

    children = descendants(local.popen.pid)
    replica_pid = next(pid for pid in children if "replica" in Path(f"/proc/{pid}/cmdline").read_text())
    os.kill(replica_pid, signal.SIGKILL)
    await wait_for_output(plex, local, "restarting solo-0")

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async def served():
            async with session.post(url + "/", json={}, headers={MODEL_ID_HEADER: "m"}) as resp:
                return resp.status == 200
        await plex.wait_until(served, timeout=90, interval=0.2, what="the restarted replica to serve")

    children = descendants(local.popen.pid)
    os.kill(local.popen.pid, signal.SIGTERM)
    assert local.popen.wait(timeout=60) == 0
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)]


async def test_local_refuses_a_bad_manifest(plex):
    bad = plex.folder / "bad.yaml"
    bad.write_text("apiVersion: modelplex.io/v1alpha1\nkind: MultiplexedDeployment\nmetadata: {name: x}\n"
                   "spec: {image: i, handler: 'h:C', maxOngoingRequests: 0}\n")
    proc = plex.processes.start("local", [*MODELPLEX, "local", str(bad), "--port", "1"])
    assert proc.popen.wait(timeout=60) == 2
    assert "maxOngoingRequests" in proc.tail()
    assert not re.search(r"Traceback", proc.tail())
