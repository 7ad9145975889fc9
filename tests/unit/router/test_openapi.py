"""The OpenAPI document is generated from the router's routes and cannot drift from them."""

from __future__ import annotations

import pytest
from openapi_spec_validator import validate

from modelplex_router.app import create_app
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.static import StaticDiscovery
from modelplex_router.openapi import OPERATIONS, openapi_document, routes_of
from modelplex_router.policy import Params
from modelplex_router.router import Router


def router_app():
    """The HTTP front of a router that is never started: its routes are all the document reads."""
    return create_app(Router(RouterConfig("d", Params(max_ongoing=4, matching_timeout_s=1.0)), StaticDiscovery([])))


def test_every_route_is_documented_and_the_document_is_valid_openapi():
    app = router_app()
    assert routes_of(app) == set(OPERATIONS)
    document = openapi_document(app)
    validate(document)
    assert set(document["paths"]["/v2/models/{model}/infer"]) == {"post"}
    assert set(document["paths"]["/"]) == {"get", "post"}


def test_a_route_without_documentation_is_refused():
    app = router_app()
    async def secret(request):
        return None

    app.router.add_get("/v1/secret", secret)
    with pytest.raises(RuntimeError, match=r"undocumented routes \[\('GET', '/v1/secret'\)\]"):
        openapi_document(app)
