"""Real servers as processes on loopback, started and always stopped by fixtures."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from support.servers import Processes, report_if_failed


@pytest.fixture
def processes(tmp_path: Path, request) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        report_if_failed(request, procs.report)
        procs.stop_all()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client with a generous total timeout (cold starts on two cores)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


