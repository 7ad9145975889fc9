"""Fixtures of the operator's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import kopf
import pytest

from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers.context import OperatorContext

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


@pytest.fixture
def posted(monkeypatch) -> list[tuple[str, str, str]]:
    """Events (kopf's poster runs only inside a running operator)."""
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda obj, type, reason, message: events.append((type, reason, message)))
    return events


@pytest.fixture
def ctx(api: ScriptedApiServer) -> OperatorContext:
    """The operator's shared state, its client pointed at the scripted API server."""
    return OperatorContext(config=OperatorConfig(), kube=api.kube())
