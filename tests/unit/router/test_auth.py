"""Who may call the router, decided from plain values (modelplex_router.auth.authorize)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelplex.wire.codec import CALL_CONTENT_TYPE
from modelplex.wire.credentials import ClientTokens, TokenFile, write_token_file
from modelplex.wire.errors import Forbidden, Unauthorized
from modelplex.wire.spec import RouterAuth, SecretRef
from modelplex_router.auth import ANONYMOUS, INTERNAL, Access, Asked, authorize
from modelplex_router.door import Route

INTERNAL_TOKEN = "internal-0123456789"


@pytest.fixture
def internal(tmp_path: Path) -> TokenFile:
    return TokenFile(write_token_file(tmp_path / "internal", INTERNAL_TOKEN))


@pytest.fixture
def clients(tmp_path: Path) -> ClientTokens:
    for name, token in {"alice": "alice-token", "bob": "bob-token"}.items():
        write_token_file(tmp_path / "clients" / name, token)
    return ClientTokens(tmp_path / "clients")


@pytest.fixture
def guarded(internal, clients) -> Access:
    auth = RouterAuth(secret_ref=SecretRef(name="clients"), models={"bob": ("public-*",)})
    return Access(auth=auth, client_tokens=clients, internal=internal)


def test_probes_are_open_to_anyone(guarded):
    for path in ("/healthz", "/readyz", "/v2/health/ready"):
        assert authorize(guarded, Asked(Route.OPEN, path)) == ANONYMOUS


def test_metrics_on_the_public_port_are_the_handlers_path_and_need_a_token(guarded):
    # The router's metrics are on its control port; /metrics here reaches the handler.
    with pytest.raises(Unauthorized):
        authorize(guarded, Asked(Route.MODEL, "/metrics"))


@pytest.mark.parametrize("action", ["load", "unload"])
def test_model_control_is_forbidden_while_off_whatever_credential_was_sent(guarded, action):
    route = Route.LOAD if action == "load" else Route.UNLOAD
    for asked in (Asked(route), Asked(route, bearer="alice-token"), Asked(route, internal_token=INTERNAL_TOKEN)):
        with pytest.raises(Forbidden, match="spec.router.modelControl"):
            authorize(guarded, asked)
    assert authorize(Access(model_control=True), Asked(route)) == ANONYMOUS


def test_a_method_call_envelope_needs_the_internal_credential(guarded, internal):
    envelope = Asked(Route.MODEL, "/", content_type=CALL_CONTENT_TYPE, model="m1")
    for asked in (envelope, Asked(Route.MODEL, "/", content_type=CALL_CONTENT_TYPE, bearer="alice-token"),
                  Asked(Route.MODEL, "/", content_type=CALL_CONTENT_TYPE, internal_token="a guess")):
        with pytest.raises(Forbidden, match="handles"):
            authorize(guarded, asked)
        with pytest.raises(Forbidden):
            authorize(Access(internal=internal), asked)  # auth off: the same
    assert authorize(guarded, Asked(Route.MODEL, "/", content_type=CALL_CONTENT_TYPE, internal_token=INTERNAL_TOKEN)) == INTERNAL


def test_with_auth_off_a_plain_request_and_the_routing_table_are_open(internal):
    access = Access(internal=internal)
    assert authorize(access, Asked(Route.MODEL, "/", model="m1")) == ANONYMOUS
    assert authorize(access, Asked(Route.INTERNALS, "/v1/replicas")) == ANONYMOUS


def test_with_auth_on_a_missing_or_wrong_token_is_401_and_a_good_one_names_its_client(guarded):
    with pytest.raises(Unauthorized) as missing:
        authorize(guarded, Asked(Route.MODEL, "/", model="m1"))
    assert missing.value.status == 401
    assert missing.value.response_headers()["WWW-Authenticate"].startswith("Bearer")
    with pytest.raises(Unauthorized, match="not valid"):
        authorize(guarded, Asked(Route.MODEL, "/", model="m1", bearer="alice-token-but-longer"))
    assert authorize(guarded, Asked(Route.MODEL, "/", model="private-1", bearer="alice-token")) == "alice"


def test_a_client_outside_its_globs_is_forbidden_naming_itself_and_the_model(guarded):
    assert authorize(guarded, Asked(Route.MODEL, "/v2/models/public-7/infer", model="public-7", bearer="bob-token")) == "bob"
    with pytest.raises(Forbidden) as refused:
        authorize(guarded, Asked(Route.MODEL, "/", model="private-1", bearer="bob-token"))
    assert "'bob'" in refused.value.message and "'private-1'" in refused.value.message


def test_with_auth_on_routing_internals_are_for_internal_callers_only(guarded):
    for path in ("/v1/replicas", "/v1/load"):
        with pytest.raises(Forbidden):
            authorize(guarded, Asked(Route.INTERNALS, path, bearer="alice-token"))
        assert authorize(guarded, Asked(Route.INTERNALS, path, internal_token=INTERNAL_TOKEN)) == INTERNAL


def test_auth_on_with_no_tokens_mounted_lets_nobody_in():
    access = Access(auth=RouterAuth(secret_ref=SecretRef(name="missing")))
    with pytest.raises(Unauthorized):
        authorize(access, Asked(Route.MODEL, "/", bearer="anything"))
