"""The one model id a request is served with, and what of a client's request reaches the
handler (modelplex_router.door, modelplex_router.relayed): decided from plain values."""

from __future__ import annotations

import pytest

from modelplex.wire.errors import BadRequest
from modelplex.wire.internal_headers import ON_COLD_HEADER, is_internal_header
from modelplex.wire.spec import RouterAuth, SecretRef, parse_deployment
from modelplex_router import cold
from modelplex_router.auth import INTERNAL, Access, may_see
from modelplex_router.config import RouterConfig
from modelplex_router.door import header_models, served_model
from modelplex_router.relayed import relayed_headers, without_param


def test_a_path_id_is_served_and_a_header_may_only_repeat_it():
    assert served_model("org/name", ()) == "org/name"
    assert served_model("org/name", ("org/name",)) == "org/name"
    with pytest.raises(BadRequest) as refused:
        served_model("public-1", ("private-b",))
    assert refused.value.status == 400
    assert "'private-b'" in refused.value.message and "'public-1'" in refused.value.message


def test_without_a_path_id_the_header_is_served_and_two_spellings_must_agree():
    assert served_model(None, header_models({"serve_multiplexed_model_id": "m1"})) == "m1"
    assert served_model(None, header_models({"serve-multiplexed-model-id": "m1"})) == "m1"
    assert served_model(None, ("m1", "m1")) == "m1"
    assert served_model(None, ()) == ""
    with pytest.raises(BadRequest):
        served_model(None, header_models({"serve_multiplexed_model_id": "public-1",
                                          "serve-multiplexed-model-id": "private-b"}))


def test_the_on_cold_header_is_a_clients_and_every_other_modelplex_header_is_internal():
    assert cold.ON_COLD_HEADER == ON_COLD_HEADER and not is_internal_header("X-Modelplex-On-Cold")
    for name in ("X-Modelplex-Internal-Token", "x-modelplex-path", "X-Modelplex-Protocol", "X-MODELPLEX-NEW"):
        assert is_internal_header(name)
    assert not is_internal_header("X-Request-Id")


def test_a_scoped_client_sees_only_its_models_listed():
    auth = RouterAuth(secret_ref=SecretRef(name="clients"), models={"bob": ("public-*",)})
    access = Access(auth=auth)
    assert may_see(access, "bob", "public-1") and not may_see(access, "bob", "private-1")
    assert may_see(access, "alice", "private-1") and may_see(access, INTERNAL, "private-1")
    assert may_see(Access(), "", "private-1")  # auth off: everyone sees everything


def test_the_handler_gets_the_routers_model_id_and_no_internal_header():
    sent = relayed_headers("POST", "/v1/models/public-1/predict", [
        ("serve_multiplexed_model_id", "private-b"), ("serve-multiplexed-model-id", "private-c"),
        ("X-Modelplex-Internal-Token", "a guess"), ("X-Modelplex-Protocol", "oip-v2"),
        (ON_COLD_HEADER, "reject"), ("Cookie", "a=1")], (), keep_credentials=True)
    assert "serve_multiplexed_model_id" not in sent and "serve-multiplexed-model-id" not in sent
    assert "X-Modelplex-Internal-Token" not in sent and "X-Modelplex-Protocol" not in sent
    assert sent[ON_COLD_HEADER] == "reject" and sent["Cookie"] == "a=1"
    assert sent["X-Modelplex-Path"] == "/v1/models/public-1/predict"


def test_the_bearer_token_and_access_token_the_router_read_stay_at_the_router():
    headers = [("Authorization", "Bearer alice-token"), ("Cookie", "s=1")]
    kept = relayed_headers("GET", "/api/x?a=1&access_token=alice-token&b=%2F", headers, (), keep_credentials=False)
    assert "Authorization" not in kept and kept["Cookie"] == "s=1"
    assert kept["X-Modelplex-Path"] == "/api/x?a=1&b=%2F"
    passed = relayed_headers("GET", "/api/x?access_token=t", headers, (), keep_credentials=True)
    assert passed["Authorization"] == "Bearer alice-token" and passed["X-Modelplex-Path"] == "/api/x?access_token=t"
    # An Authorization the router does not read (Basic: a gateway's, an app's) passes as sent.
    basic = relayed_headers("GET", "/", [("Authorization", "Basic Zm9vOmJhcg==")], (), keep_credentials=False)
    assert basic["Authorization"] == "Basic Zm9vOmJhcg=="


def test_removing_a_query_parameter_keeps_the_rest_as_sent():
    assert without_param("/p?access_token=x", "access_token") == "/p"
    assert without_param("/p?a=%20&access%5Ftoken=x&c", "access_token") == "/p?a=%20&c"
    assert without_param("/p", "access_token") == "/p"


def test_forward_credentials_is_off_unless_the_spec_turns_it_on():
    def config(router: dict) -> RouterConfig:
        return RouterConfig.from_deployment(parse_deployment({
            "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "d"},
            "spec": {"image": "x", "handler": "m:H", "router": router}}), env={})

    assert config({}).forward_credentials is False
    assert config({"forwardCredentials": True}).forward_credentials is True
