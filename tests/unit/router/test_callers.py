"""Another deployment's credential at a router: nothing unless this deployment lists it as a
caller (``spec.router.callers``), and then a named client of its own name, whose globs apply and
who never gets the deployment's own components' rights."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelplex.wire.codec import CALL_CONTENT_TYPE
from modelplex.wire.credentials import CallerTokens, DeploymentCredential, TokenFile, write_token_file
from modelplex.wire.errors import Forbidden
from modelplex.wire.spec import RouterAuth, SecretRef
from modelplex_router.auth import INTERNAL, Access, Asked, authorize
from modelplex_router.cold import quota_client
from modelplex_router.door import Route

OWN = "own-deployment-token"
FRONTEND = "frontend-deployment-token"
STRANGER = "stranger-deployment-token"


@pytest.fixture
def internal(tmp_path: Path) -> DeploymentCredential:
    """This router's deployment's credential; ``frontend`` is the one caller it lists."""
    write_token_file(tmp_path / "callers" / "frontend", FRONTEND)
    return DeploymentCredential(write_token_file(tmp_path / "own", OWN))


@pytest.fixture
def callers(tmp_path: Path, internal) -> CallerTokens:
    return CallerTokens(tmp_path / "callers")


def call(token: str, model: str = "public-1", route: Route = Route.MODEL) -> Asked:
    return Asked(route, "/", content_type=CALL_CONTENT_TYPE, internal_token=token, model=model)


def test_an_unlisted_deployment_s_credential_gets_nothing_a_listed_one_is_a_client_of_its_name(internal, callers):
    unlisted = Access(internal=internal)
    for token in (FRONTEND, STRANGER):
        with pytest.raises(Forbidden, match="method calls"):
            authorize(unlisted, call(token))
    listed = Access(internal=internal, callers=callers)
    assert authorize(listed, call(FRONTEND)) == "frontend"
    with pytest.raises(Forbidden):
        authorize(listed, call(STRANGER))  # a label, a namespace: nothing else grants it
    assert authorize(listed, call(OWN)) == INTERNAL  # the deployment's own components


def test_a_caller_is_held_to_its_globs_and_its_quota_and_never_reads_the_routing_table(internal, callers):
    auth = RouterAuth(secret_ref=SecretRef(name="clients"), models={"frontend": ("public-*",)})
    access = Access(auth=auth, internal=internal, callers=callers)
    assert authorize(access, call(FRONTEND, "public-1")) == "frontend"
    with pytest.raises(Forbidden, match="'frontend' may not call model 'private-1'"):
        authorize(access, call(FRONTEND, "private-1"))
    with pytest.raises(Forbidden, match="own components"):
        authorize(access, Asked(Route.INTERNALS, "/v1/replicas", internal_token=FRONTEND))
    assert quota_client("frontend", "10.0.0.7") == "frontend"  # its own bucket, not unlimited


def test_a_router_takes_local_mode_s_run_credential_as_its_components_and_refuses_a_rotated_out_caller(
        tmp_path, internal, callers):
    run = TokenFile(write_token_file(tmp_path / "run", "the-run-token"))
    access = Access(internal=DeploymentCredential(internal.path, None, (run,)), callers=callers)
    assert authorize(access, call("the-run-token")) == INTERNAL
    write_token_file(tmp_path / "callers" / "frontend", "frontend-rotated")
    assert authorize(access, call("frontend-rotated")) == "frontend"
    with pytest.raises(Forbidden):
        authorize(access, call(FRONTEND))
