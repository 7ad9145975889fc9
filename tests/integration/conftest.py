"""Real servers as processes on loopback, started and always stopped by fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from support.servers import Processes


@pytest.fixture
def processes(tmp_path: Path, request) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        call = getattr(request.node, "rep_call", None)
        if call is not None and call.failed:
            print(procs.report())
        procs.stop_all()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


