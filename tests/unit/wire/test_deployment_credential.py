"""A deployment's internal credential as its processes hold it: its own token, the namespace's
beside it while an upgrade lasts (sent, accepted, then refused after a grace), and a router's
callers' credentials, each re-read when its file changes."""

from __future__ import annotations

from unit.wire.test_credentials import secret_volume

from modelplex.wire.credentials import (RECHECK_S, CallerTokens, DeploymentCredential, TokenFile, internal_token_file,
                                        write_token_file)


def test_during_an_upgrade_the_namespace_token_is_sent_and_both_are_accepted_then_it_is_refused_after_a_grace(
        tmp_path):
    own = write_token_file(tmp_path / "token", "deployment-token")
    legacy = write_token_file(tmp_path / "namespace-token", "namespace-token")
    now = [1000.0]
    credential = DeploymentCredential(own, TokenFile(legacy, clock=lambda: now[0]), grace_s=180, clock=lambda: now[0])
    # Pods that have not rolled know only the namespace's token: it is what this pod sends.
    assert credential.token() == "namespace-token" and credential.own() == "deployment-token"
    assert credential.accepts("deployment-token") and credential.accepts("namespace-token")
    assert not credential.accepts("another-deployment-token") and not credential.accepts(None)

    legacy.unlink()  # every pod has rolled: the operator took the key out of the Secret
    now[0] += RECHECK_S
    assert credential.token() == "deployment-token"
    now[0] += 179 - RECHECK_S  # another pod's files may not have been updated yet
    assert credential.accepts("namespace-token")
    now[0] += 2
    assert not credential.accepts("namespace-token") and credential.accepts("deployment-token")


def test_a_credential_without_an_upgrade_sends_and_accepts_its_own_token_only(tmp_path):
    credential = DeploymentCredential(write_token_file(tmp_path / "token", "mine"), TokenFile(tmp_path / "absent"))
    assert credential.token() == "mine" and credential.accepts("mine") and not credential.accepts("")


def test_tokens_accepted_beside_the_own_one_are_never_sent(tmp_path):
    run = TokenFile(write_token_file(tmp_path / "run", "the-run-token"))
    credential = DeploymentCredential(write_token_file(tmp_path / "token", "mine"), None, (run,))
    assert credential.accepts("the-run-token") and credential.token() == "mine"


def test_a_process_takes_its_deployment_credential_and_the_upgrade_file_from_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPLEX_INTERNAL_TOKEN_FILE", str(write_token_file(tmp_path / "token", "mine")))
    monkeypatch.setenv("MODELPLEX_LEGACY_TOKEN_FILE", str(write_token_file(tmp_path / "ns", "namespace")))
    monkeypatch.setenv("MODELPLEX_RUN_TOKEN_FILE", str(write_token_file(tmp_path / "run", "run")))
    credential = internal_token_file()
    assert credential is not None and credential.token() == "namespace"
    assert not credential.accepts("run")  # a replica takes no run credential
    assert internal_token_file(accept_run=True).accepts("run")  # a router of the run does


def test_callers_are_named_by_their_files_and_follow_a_secret_volume_update(tmp_path):
    folder = tmp_path / "callers"
    secret_volume(folder, "2026_11_28_01", {"frontend": "f1", "internal": "nope"})
    now = [100.0]
    callers = CallerTokens(folder, clock=lambda: now[0])
    assert callers.client_for("f1") == "frontend"
    assert callers.client_for("nope") is None  # the router's own name is never a caller's
    secret_volume(folder, "2026_11_28_02", {"frontend": "f2"})
    now[0] += RECHECK_S
    assert callers.client_for("f2") == "frontend" and callers.client_for("f1") is None


def test_callers_linked_to_their_own_token_files_see_a_rotation_of_those_files(tmp_path):
    token = write_token_file(tmp_path / "credentials" / "frontend", "f1")
    folder = tmp_path / "callers"
    folder.mkdir()
    (folder / "frontend").symlink_to(token)
    now = [100.0]
    callers = CallerTokens(folder, clock=lambda: now[0])
    assert callers.client_for("f1") == "frontend"
    write_token_file(token, "f2-rotated")
    now[0] += RECHECK_S
    assert callers.client_for("f2-rotated") == "frontend" and callers.client_for("f1") is None
