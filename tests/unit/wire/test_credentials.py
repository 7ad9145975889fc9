"""The internal credential and client tokens as files: read again when they change."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from modelplex.wire.credentials import RECHECK_S, ClientTokens, TokenFile, same_token, write_token_file


def test_a_token_file_is_private_to_its_owner_and_read_back(tmp_path):
    path = write_token_file(tmp_path / "run" / "token", "t0")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TokenFile(path).token() == "t0"


def test_a_rotated_token_is_used_from_the_next_check_and_the_old_one_refused(tmp_path):
    now = [100.0]
    token = TokenFile(write_token_file(tmp_path / "token", "old-value"), clock=lambda: now[0])
    assert token.accepts("old-value")
    write_token_file(tmp_path / "token", "a-new-value")
    now[0] += RECHECK_S
    assert token.accepts("a-new-value") and not token.accepts("old-value")


def test_a_token_file_is_looked_at_no_more_than_once_per_recheck_interval(tmp_path):
    now = [100.0]
    token = TokenFile(write_token_file(tmp_path / "token", "old-value"), clock=lambda: now[0])
    assert token.token() == "old-value"
    write_token_file(tmp_path / "token", "a-new-value")
    now[0] += RECHECK_S * 0.9
    assert token.token() == "old-value"  # every request asks: no stat() for each of them
    now[0] += RECHECK_S * 0.1
    assert token.token() == "a-new-value"


def test_a_token_file_written_after_the_first_look_is_read_at_once(tmp_path):
    token = TokenFile(tmp_path / "token", clock=lambda: 100.0)
    assert token.token() is None
    write_token_file(tmp_path / "token", "late-value")
    assert token.token() == "late-value"


def test_a_missing_or_empty_token_file_accepts_nothing(tmp_path):
    assert not TokenFile(tmp_path / "absent").accepts("")
    empty = TokenFile(write_token_file(tmp_path / "empty", "  \n"))
    assert empty.token() is None and not empty.accepts("") and not empty.accepts(None)


def secret_volume(folder: Path, generation: str, data: dict[str, str]) -> None:
    """What the kubelet does on a Secret's update: a new timestamped folder, then the ``..data``
    link swapped to it; the key files are links through ``..data``."""
    target = folder / f"..{generation}"
    target.mkdir(parents=True)
    for key, value in data.items():
        (target / key).write_text(value)
    link = folder / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, folder / "..data")
    for key in data:
        if not (folder / key).is_symlink():
            (folder / key).symlink_to(f"..data/{key}")


def test_client_tokens_follow_a_secret_volume_update(tmp_path):
    folder = tmp_path / "clients"
    secret_volume(folder, "2026_11_26_01", {"alice": "a1", "bob": "b1"})
    now = [100.0]
    tokens = ClientTokens(folder, clock=lambda: now[0])
    assert tokens.client_for("a1") == "alice" and tokens.client_for("b1") == "bob"
    secret_volume(folder, "2026_11_26_02", {"alice": "a2", "bob": "b1"})
    now[0] += RECHECK_S
    assert tokens.client_for("a2") == "alice" and tokens.client_for("a1") is None


def test_tokens_compare_equal_only_when_equal():
    assert same_token("abc", "abc")
    assert not same_token("abc", "abd") and not same_token("abc", "abcd") and not same_token("", "abc")
