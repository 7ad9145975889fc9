"""The operator's settings from its environment."""

from __future__ import annotations

import pytest

from modelplex_operator.config import DEFAULT_ROUTER_IMAGE, ConfigError, OperatorConfig


def test_defaults_watch_the_whole_cluster():
    config = OperatorConfig.from_env({})
    assert config.clusterwide and config.namespaces == ()
    assert config.router_image == DEFAULT_ROUTER_IMAGE
    assert config.log_level == "info"
    assert config.health_endpoint == "http://0.0.0.0:8080/healthz"


def test_from_env():
    config = OperatorConfig.from_env({
        "MODELPLEX_WATCH_NAMESPACES": " team-a, team-b ,,team-a",
        "MODELPLEX_ROUTER_IMAGE": "reg/router:1",
        "MODELPLEX_LOG_LEVEL": "DEBUG",
        "MODELPLEX_OPERATOR_HEALTH": "",
        "MODELPLEX_OPERATOR_RESYNC_SECONDS": "30",
        "MODELPLEX_IMAGE_PULL_POLICY": "IfNotPresent",
    })
    assert config.namespaces == ("team-a", "team-b") and not config.clusterwide
    assert config.router_image == "reg/router:1"
    assert config.log_level == "debug"
    assert config.health_endpoint == ""
    assert config.resync_seconds == 30.0
    assert config.image_pull_policy == "IfNotPresent"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MODELPLEX_LOG_LEVEL": "loud"}, "MODELPLEX_LOG_LEVEL: must be one of"),
        ({"MODELPLEX_OPERATOR_RESYNC_SECONDS": "soon"}, "MODELPLEX_OPERATOR_RESYNC_SECONDS: must be a number"),
        ({"MODELPLEX_OPERATOR_RESYNC_SECONDS": "0"}, "at least 1"),
        ({"MODELPLEX_IMAGE_PULL_POLICY": "Sometimes"}, "MODELPLEX_IMAGE_PULL_POLICY"),
    ],
)
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        OperatorConfig.from_env(env)


def test_the_operator_namespace_comes_from_the_variable_else_the_service_account(tmp_path):
    account = tmp_path / "namespace"
    account.write_text("modelplex-system\n")
    assert OperatorConfig.from_env({}, service_account_namespace=str(account)).operator_namespace == "modelplex-system"
    named = OperatorConfig.from_env({"MODELPLEX_OPERATOR_NAMESPACE": "ops"}, service_account_namespace=str(account))
    assert named.operator_namespace == "ops"
    assert OperatorConfig.from_env({}, service_account_namespace=str(tmp_path / "absent")).operator_namespace == ""
