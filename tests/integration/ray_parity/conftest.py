"""One ``modelplex local`` stack of the deployments in parity.py, started once for the package
(a cold start of two dozen processes costs tens of seconds on two cores)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from modelplex.wire import credentials
from modelplex.wire.credentials import ENV_INTERNAL_TOKEN_FILE, TokenFile, new_token, write_token_file

from support.servers import Processes, report_if_failed
from support.stacks import Stack, manifest, start_local, write_documents

HERE = Path(__file__).resolve().parent
DEPLOYMENTS = {
    "batched": "parity:Batched",
    "async-streamer": "parity:AsyncStreamer",
    "sync-streamer": "parity:SyncStreamer",
    "text-streamer": "parity:TextStreamer",
    "echo": "parity:Echo",
    "loader": "parity:Loader",
    "lru": "parity:Loader",
    "delegate": "parity:Delegate",
    "async-text-streamer": "parity:AsyncTextStreamer",
    "streaming-app": "parity:StreamingApp",
    "sync-gen-function": "parity:sync_gen_function",
    "async-gen-function": "parity:async_gen_function",
    "returns-streams": "parity:ReturnsStreams",
    "sync-returns-streams": "parity:SyncReturnsStreams",
}
#: Spec fields per deployment, beyond one replica of its handler.
SPECS = {"loader": {"replicas": 2, "maxOngoingRequests": 1}, "lru": {"multiplexing": {"maxModelsPerReplica": 2}},
         "text-streamer": {"replicas": 2}, "async-text-streamer": {"replicas": 2}, "streaming-app": {"replicas": 2}}
#: Who calls whom through handles (parity.py): a router takes the credentials of the callers it lists.
CALLERS = {"async-streamer": ["streaming-app", "delegate", "async-text-streamer"],
           "sync-streamer": ["streaming-app", "delegate", "async-text-streamer"],
           "sync-gen-function": ["delegate"], "async-gen-function": ["delegate"], "echo": ["delegate"]}
for _name, _callers in CALLERS.items():
    SPECS.setdefault(_name, {})["router"] = {"callers": _callers}


@pytest.fixture(scope="package", autouse=True)
def _credential(tmp_path_factory) -> Iterator[Path]:
    """This package's internal credential, for the stack, the replicas its tests start and their
    handles (the test process calls methods by name, as a script's handles do: the trust
    boundary answers 403 to method calls without it)."""
    path = write_token_file(tmp_path_factory.mktemp("credential") / "internal-token", new_token())
    # Not through os.environ: a fixture of a folder without __init__.py lives as long as the
    # session, and every replica a later test starts by hand would inherit it (and refuse that
    # test's plain calls).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(credentials, "_in_use", TokenFile(path))
        yield path


@pytest.fixture(scope="package")
def _parity_stack(tmp_path_factory, _credential) -> Iterator[Stack]:
    processes = Processes(tmp_path_factory.mktemp("parity"))
    try:
        shutil.copy(HERE / "parity.py", processes.folder / "parity.py")
        path = write_documents(processes.folder / "parity.yaml",
                               [manifest(name, handler, **SPECS.get(name, {})) for name, handler in DEPLOYMENTS.items()])
        yield start_local(processes, path, deployments=len(DEPLOYMENTS), env={ENV_INTERNAL_TOKEN_FILE: str(_credential)})
    finally:
        processes.stop_all()


@pytest.fixture
def stack(_parity_stack: Stack, request) -> Iterator[Stack]:
    yield _parity_stack
    report_if_failed(request, _parity_stack.report)
