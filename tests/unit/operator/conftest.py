"""Fixtures of the operator's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.apiserver import ScriptedApiServer, scripted_api_server


@pytest.fixture(scope="module")
def _api_server() -> Iterator[ScriptedApiServer]:
    with scripted_api_server() as server:
        yield server


@pytest.fixture
def api(_api_server: ScriptedApiServer) -> ScriptedApiServer:
    """A Kubernetes API's HTTP shape on loopback (support/apiserver.py), fresh for each test."""
    _api_server.reset()
    return _api_server
