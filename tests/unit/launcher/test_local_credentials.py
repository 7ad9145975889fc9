"""Local mode's credentials as a cluster's: one per deployment for its replicas and handles, a
router's listed callers as files named after them, the run's own for its scripts (routers only),
and an auth Secret with a client named ``internal`` refused at start (exit 1, naming the key)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import yaml

from modelplex.processes import consecutive_free_ports
from modelplex.wire.credentials import CallerTokens, DeploymentCredential, TokenFile
from modelplex_launcher.local import LocalRun, plan, run_local


def deployment(name: str, **router) -> dict:
    return {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": name},
            "spec": {"image": "local", "handler": "h:H", "replicas": 1, "router": router}}


def write(tmp_path, *documents) -> str:
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def test_each_deployment_has_its_own_credential_and_a_router_its_callers_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("MODELPLEX_INTERNAL_TOKEN_FILE", raising=False)
    path = write(tmp_path, deployment("front"), deployment("scorer", callers=["front", "elsewhere"]))
    run = LocalRun(plan([path], host="127.0.0.1", port=consecutive_free_ports(2)), out=io.StringIO())
    try:
        replicas = {child.name: child.env for child in run.replicas}
        routers = {child.name: child.env for child in run.routers}
        front = TokenFile(Path(replicas["front-0"]["MODELPLEX_INTERNAL_TOKEN_FILE"])).token()
        scorer = TokenFile(Path(replicas["scorer-0"]["MODELPLEX_INTERNAL_TOKEN_FILE"])).token()
        run_token = run.internal_token.token()
        assert front and scorer and run_token and len({front, scorer, run_token}) == 3
        # A replica holds its own deployment's credential and nothing else.
        assert "MODELPLEX_RUN_TOKEN_FILE" not in replicas["scorer-0"]
        assert "MODELPLEX_CALLER_TOKENS_DIR" not in replicas["scorer-0"]
        # The scorer's router: its own deployment's, the run's (scripts), and front as a caller.
        env = routers["scorer router"]
        assert TokenFile(Path(env["MODELPLEX_INTERNAL_TOKEN_FILE"])).token() == scorer
        assert DeploymentCredential(Path(env["MODELPLEX_INTERNAL_TOKEN_FILE"]), None,
                                    (TokenFile(Path(env["MODELPLEX_RUN_TOKEN_FILE"])),)).accepts(run_token)
        callers = CallerTokens(Path(env["MODELPLEX_CALLER_TOKENS_DIR"]))
        assert callers.client_for(front) == "front" and callers.client_for(scorer) is None
        assert sorted(os.listdir(env["MODELPLEX_CALLER_TOKENS_DIR"])) == ["front"]
        assert "caller 'elsewhere' is not a deployment of this run" in run.out.getvalue()
        # The front's router lists nobody: the scorer's credential is nothing to it.
        assert CallerTokens(Path(routers["front router"]["MODELPLEX_CALLER_TOKENS_DIR"])).client_for(scorer) is None
        assert run.token_of("scorer") == scorer
    finally:
        run.shutdown()


def test_a_client_named_internal_stops_local_mode_at_start_with_exit_1_naming_the_key_not_the_token(
        tmp_path, capsys):
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "clients"},
              "stringData": {"alice": "alice-token-1", "internal": "sneaky-token-2"}}
    path = write(tmp_path, deployment("recs", auth={"secretRef": {"name": "clients"}}), secret)
    assert run_local([path], port=consecutive_free_ports(1)) == 1
    err = capsys.readouterr().err
    assert "client named 'internal'" in err and "'clients'" in err
    assert "sneaky-token-2" not in err and "alice-token-1" not in err


def test_a_source_uri_with_a_password_is_refused_by_local_mode_without_showing_it(tmp_path, capsys):
    doc = deployment("recs")
    doc["spec"]["modelSource"] = {"uri": "https://reader:hunter2@models.example.com/{model_id}.pt"}
    assert run_local([write(tmp_path, doc)], port=consecutive_free_ports(1)) == 2
    err = capsys.readouterr().err
    assert "spec.modelSource.uri" in err and "secretRef" in err and "hunter2" not in err
