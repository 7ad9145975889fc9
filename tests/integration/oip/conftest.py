"""Deployments for the OIP, HTTP-edge and monitoring tests: a real replica and a real router per
deployment, as processes on loopback, shared by a module and always stopped.

``zoo`` serves real TorchScript MLPs (built here) with the built-in handler; the others serve
the handlers in ``handlers.py``.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch import nn

from support.servers import START_TIMEOUT_S, Processes, free_port

HERE = Path(__file__).resolve().parent
IN_FEATURES, OUT_FEATURES = 16, 4


@dataclass
class Deployment:
    name: str
    router_url: str
    replica_url: str
    folder: Path
    #: The router's control port: its /metrics.
    router_control_url: str = ""


def build_mlp(seed: int) -> torch.jit.ScriptModule:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, 32), nn.ReLU(), nn.Linear(32, OUT_FEATURES))
    return torch.jit.script(model.eval())


def build_models(folder: Path) -> None:
    """``mlp-a``, ``mlp-b``: metadata read from the module; ``declared``: from its modelplex.json."""
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(build_mlp(1), str(folder / "mlp-a.pt"))
        torch.jit.save(build_mlp(2), str(folder / "mlp-b.pt"))
        declared = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, IN_FEATURES]}],
                    "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, OUT_FEATURES]}]}
        torch.jit.save(build_mlp(3), str(folder / "declared.pt"), _extra_files={"modelplex.json": json.dumps(declared)})


def _wait_ready(processes: Processes, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc in processes.procs:
            assert proc.alive(), f"{proc.name} exited early:\n{proc.tail()}"
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as response:
                if json.loads(response.read())["ready_replicas"] >= 1:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"the router at {url} saw no ready replica within {START_TIMEOUT_S:g} s\n{processes.report()}")


def deploy(processes: Processes, name: str, spec: dict) -> Deployment:
    folder = processes.folder
    shutil.copy(HERE / "handlers.py", folder / "handlers.py")
    manifest = folder / f"{name}.yaml"
    manifest.write_text(json.dumps({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                                    "metadata": {"name": name}, "spec": {"image": "local", **spec}}))
    replica = processes.replica(manifest, name=f"{name}-replica")
    port = free_port()
    router = processes.router(manifest, port, [f"r0={replica.url}"])
    router.name = f"{name}-router"
    url = f"http://127.0.0.1:{port}"
    _wait_ready(processes, url)
    return Deployment(name, url, replica.url, folder, router.control_url)


@pytest.fixture(scope="package")
def stack(tmp_path_factory) -> Iterator[dict[str, Deployment]]:
    """The package's deployments, started once: zoo (built-in handler), tensors, events, hello, half-stream."""
    processes = Processes(tmp_path_factory.mktemp("oip"))
    try:
        build_models(processes.folder / "models")
        yield {
            "zoo": deploy(processes, "zoo", {
                "modelSource": {"uri": "file:models/{model_id}.pt"},
                "multiplexing": {"maxModelsPerReplica": 3},
                "batching": {"maxBatchSize": 16, "batchWaitTimeoutMs": 50},
                "router": {"modelControl": True},  # the repository extension's test loads and unloads
            }),
            "tensors": deploy(processes, "tensors", {"handler": "handlers:Tensors"}),
            "events": deploy(processes, "events", {"handler": "handlers:Events"}),
            "hello": deploy(processes, "hello", {"handler": "handlers:Hello"}),
            "half-stream": deploy(processes, "half-stream", {"handler": "handlers:HalfStream"}),
        }
    except BaseException:
        print(processes.report())
        raise
    finally:
        processes.stop_all()


@pytest.fixture
def zoo(stack) -> Deployment:
    return stack["zoo"]
