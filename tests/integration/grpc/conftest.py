"""One ``modelplex local`` stack for the gRPC tests, started once for the package: ``zoo`` serves
real TorchScript MLPs (built here) with the built-in handler and model control on, ``echo`` and
``countdown`` the handlers in ``handlers.py`` (model control off, as by default), ``guarded`` echo
behind router auth. Every router serves gRPC on the free port local mode prints."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch import nn

from support.servers import Processes
from support.stacks import Stack, manifest, start_local, write_documents

HERE = Path(__file__).resolve().parent
FEATURES = 16
#: The zoo's models and the seed of each one's weights.
MODELS = {"mlp-a": 11, "mlp-b": 12}
#: The ``guarded`` deployment's clients: ``bob`` may call only models named ``public-*``.
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}


def save_models(folder: Path) -> None:
    """Small TorchScript MLPs (16 features in, 4 scores out), one file per model id."""
    folder.mkdir(parents=True, exist_ok=True)
    for model_id, seed in MODELS.items():
        torch.manual_seed(seed)
        module = torch.jit.script(nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 4)).eval())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.jit.save(module, str(folder / f"{model_id}.pt"))


#: The ``flood`` deployment's spec.router.streamIdleTimeoutSeconds (its test says so too).
FLOOD_IDLE_TIMEOUT_S = 2.0


@pytest.fixture(scope="package")
def stack(tmp_path_factory) -> Iterator[Stack]:
    processes = Processes(tmp_path_factory.mktemp("grpc"))
    try:
        shutil.copy(HERE / "handlers.py", processes.folder / "handlers.py")
        save_models(processes.folder / "models")
        zoo = manifest("zoo", "", modelSource={"uri": "file:models/{model_id}.pt"},
                       multiplexing={"maxModelsPerReplica": 2}, router={"modelControl": True})
        del zoo["spec"]["handler"]  # the built-in handler
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "echo-clients"}, "stringData": TOKENS}
        guarded = manifest("guarded", "handlers:Echo", router={
            "auth": {"secretRef": {"name": "echo-clients"}, "models": {"bob": ["public-*"]}}})
        path = write_documents(processes.folder / "grpc.yaml",
                               [zoo, manifest("echo", "handlers:Echo", maxRequestBytes=65536),
                                manifest("countdown", "handlers:Countdown"), secret, guarded,
                                manifest("flood", "handlers:Flood", maxOngoingRequests=1,
                                         router={"streamIdleTimeoutSeconds": FLOOD_IDLE_TIMEOUT_S})])
        stack = start_local(processes, path, deployments=5)
        assert set(stack.grpc) == {"zoo", "echo", "countdown", "guarded", "flood"}, stack.report()
        yield stack
    finally:
        processes.stop_all()


@pytest.fixture
def tokens() -> dict[str, str]:
    """The ``guarded`` deployment's client tokens."""
    return dict(TOKENS)
