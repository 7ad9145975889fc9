"""The chaos suite: faults injected into ``modelplex local`` stacks under load.

Each test adds one line to the suite's report (requests sent, lost, answered by status,
recovery time), printed at the end of the run and written to ``chaos-report.txt`` in pytest's
base temporary folder (and to ``$MODELPLEX_CHAOS_REPORT`` when set)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import pytest

from support.servers import Processes

HERE = Path(__file__).resolve().parent
_LINES: list[str] = []


@pytest.fixture(scope="session")
def chaos_report(tmp_path_factory) -> Callable[[str], None]:
    files = [tmp_path_factory.getbasetemp() / "chaos-report.txt"]
    if os.environ.get("MODELPLEX_CHAOS_REPORT"):
        files.append(Path(os.environ["MODELPLEX_CHAOS_REPORT"]))

    def write(line: str) -> None:
        _LINES.append(line)
        print(line)
        for path in files:
            with path.open("a") as handle:
                handle.write(line + "\n")

    return write


def pytest_terminal_summary(terminalreporter) -> None:
    if _LINES:
        terminalreporter.section("chaos report")
        for line in _LINES:
            terminalreporter.write_line(line)


def chaos_folder(folder: Path) -> Path:
    shutil.copy(HERE / "handlers.py", folder / "handlers.py")
    return folder


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory, request) -> Iterator[Processes]:
    """Processes shared by one module's tests (one stack, several faults in turn)."""
    procs = Processes(chaos_folder(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])))
    try:
        yield procs
    finally:
        failed = any(getattr(item, "rep_call", None) is not None and item.rep_call.failed
                     for item in request.session.items if item.module is request.module)
        if failed:
            print(procs.report())
        procs.stop_all()


@pytest.fixture
def chaos_processes(processes: Processes) -> Processes:
    chaos_folder(processes.folder)
    return processes
