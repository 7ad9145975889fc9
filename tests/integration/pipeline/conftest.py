"""Whole deployments for the pipeline tests, run by ``modelplex local`` as real processes.

Two stacks, each started once per module (a cold start costs seconds on two cores) and
always stopped, even when a test fails:

- ``composition``: ``upstream`` → ``downstream`` (``Upstream``/``Downstream`` in
  composition.py) and ``collector`` → ``producer``;
- ``video``: the example pipeline of examples/pipeline (its manifests and modules, copied),
  with the decoder swapped for ``traced:TracedDecode`` so tests can see what it did, one
  detect replica, and stage costs cut down so each test takes a few seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from support.servers import Processes, report_if_failed
from support.stacks import Stack, manifest, start_local, write_documents

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[2] / "examples" / "pipeline"

#: Per-chunk stage costs for the tests: small, so a test is quick; the bench uses the defaults.
#: The naive orchestrator holds at most 4 MiB of video here (13 chunks), so a test can pass it.
FAST_STAGES = {"PIPELINE_DECODE_S": "0.002", "PIPELINE_DETECT_S": "0.01", "PIPELINE_ENCODE_S": "0.005",
               "PIPELINE_LOAD_S": "0.05", "PIPELINE_WINDOW": "4", "PIPELINE_NAIVE_MAX_BYTES": str(4 << 20)}


@pytest.fixture(scope="module")
def _processes(tmp_path_factory) -> Iterator[Processes]:
    processes = Processes(tmp_path_factory.mktemp("stack"))
    try:
        yield processes
    finally:
        processes.stop_all()


@pytest.fixture(scope="module")
def _composition_stack(_processes: Processes) -> Stack:
    folder = _processes.folder
    shutil.copy(HERE / "composition.py", folder / "composition.py")
    path = write_documents(folder / "composition.yaml", [
        manifest("upstream", "composition:Upstream"),
        manifest("downstream", "composition:Downstream", replicas=2, multiplexing={"maxModelsPerReplica": 2},
                 router={"callers": ["upstream"]}),  # upstream's handles call it
        manifest("collector", "composition:Collector"),
        manifest("producer", "composition:Producer", router={"callers": ["collector"]}),
    ])
    return start_local(_processes, path, deployments=4)


@pytest.fixture(scope="module")
def _video_stack(_processes: Processes) -> Stack:
    """The example's own manifests and modules, with the traced decoder and one detect replica."""
    folder = _processes.folder
    for module in ("frames.py", "stages.py", "orchestrators.py"):
        shutil.copy(EXAMPLE / module, folder / module)
    shutil.copy(HERE / "traced.py", folder / "traced.py")
    documents = list(yaml.safe_load_all((EXAMPLE / "pipeline.yaml").read_text()))
    for document in documents:
        spec = document["spec"]
        if document["metadata"]["name"] == "decode":
            assert spec["handler"] == "stages:Decode"
            spec["handler"] = "traced:TracedDecode"
        spec["replicas"] = 1  # two cores: one of each is enough to show the behaviour
    path = write_documents(folder / "pipeline.yaml", documents)
    return start_local(_processes, path, deployments=len(documents), env=FAST_STAGES)


@pytest.fixture
def composition(_composition_stack: Stack, request) -> Iterator[Stack]:
    yield _composition_stack
    report_if_failed(request, _composition_stack.report)


@pytest.fixture
def video_stack(_video_stack: Stack, request) -> Iterator[Stack]:
    yield _video_stack
    report_if_failed(request, _video_stack.report)
