"""The router's client list on a live reload: a list naming a client ``internal`` is refused
whole and the last good one stays; the key is logged, never a token."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from modelplex.wire.credentials import RECHECK_S, ClientTokens, write_token_file
from modelplex.wire.errors import Unauthorized
from modelplex.wire.spec import RouterAuth, SecretRef
from modelplex_router.auth import Access, Asked, authorize
from modelplex_router.clients import KnownClients
from modelplex_router.door import Route


def _write(folder: Path, tokens: dict[str, str]) -> None:
    for entry in folder.glob("*"):
        entry.unlink()
    for name, token in tokens.items():
        write_token_file(folder / name, token)
    stamp = folder.stat().st_mtime_ns + 1_000_000  # a reload the watcher sees, however fast the test runs
    os.utime(folder, ns=(stamp, stamp))


def test_a_reload_naming_a_client_internal_keeps_the_last_good_list_and_logs_the_key_only(tmp_path, caplog):
    folder = tmp_path / "clients"
    folder.mkdir()
    _write(folder, {"alice": "alice-token-0123"})
    now = [100.0]
    clients = KnownClients(ClientTokens(folder, clock=lambda: now[0]))
    assert clients.client_for("alice-token-0123") == "alice"
    _write(folder, {"alice": "alice-token-4567", "internal": "sneaky-token-0123"})
    now[0] += RECHECK_S
    with caplog.at_level(logging.ERROR, logger="modelplex.router.auth"):
        assert clients.client_for("sneaky-token-0123") is None
        assert clients.client_for("alice-token-4567") is None
        assert clients.client_for("alice-token-0123") == "alice"  # the last good list
    assert "'internal'" in caplog.text
    assert not any(token in caplog.text for token in ("sneaky-token-0123", "alice-token-4567", "alice-token-0123"))
    _write(folder, {"alice": "alice-token-4567"})
    now[0] += RECHECK_S
    assert clients.client_for("alice-token-4567") == "alice"


def test_a_first_list_naming_a_client_internal_accepts_nobody(tmp_path):
    folder = tmp_path / "clients"
    folder.mkdir()
    _write(folder, {"internal": "sneaky-token-0123", "bob": "bob-token-0123"})
    access = Access(auth=RouterAuth(secret_ref=SecretRef(name="c")), client_tokens=KnownClients(ClientTokens(folder)))
    for token in ("sneaky-token-0123", "bob-token-0123"):
        with pytest.raises(Unauthorized):
            authorize(access, Asked(Route.INTERNALS, "/v1/replicas", bearer=token))


def test_a_client_named_internal_is_never_taken_for_a_component(tmp_path):
    """Even through a token source that does not refuse the name (the plain folder)."""
    write_token_file(tmp_path / "clients" / "internal", "sneaky-token-0123")
    access = Access(auth=RouterAuth(secret_ref=SecretRef(name="c")), client_tokens=ClientTokens(tmp_path / "clients"))
    with pytest.raises(Unauthorized):
        authorize(access, Asked(Route.INTERNALS, "/v1/replicas", bearer="sneaky-token-0123"))
