"""The Endpoint Picker tells, from a request's method and path alone, what the chosen replica
must serve (and where on it) or what the picker answers itself: the router's paths, the model
id in a path decoded once."""

from __future__ import annotations

from modelplex_router.door import Route
from modelplex_router.endpoints import INVOKE_PATH
from modelplex_router.picker.routes import Answered, Local, Upstream, classify


def test_an_oip_inference_goes_to_the_replicas_invoke_path_with_its_decoded_model_and_version():
    assert classify("POST", "/v2/models/team%2Fa/versions/1/infer") == Upstream(
        Route.MODEL, "team/a", "POST", INVOKE_PATH, oip=True, version="1")
    assert classify("POST", "/v2/models/m/infer?x=1") == Upstream(Route.MODEL, "m", "POST", INVOKE_PATH, oip=True)


def test_model_metadata_goes_to_the_replicas_metadata_route():
    assert classify("GET", "/v2/models/team%2Fa") == Upstream(Route.MODEL, "team/a", "GET",
                                                              "/v1/models/team%2Fa/metadata")


def test_handler_requests_go_to_invoke_with_the_clients_method_and_path_forwarded():
    assert classify("PUT", "/items/7?q=1") == Upstream(Route.MODEL, None, "POST", INVOKE_PATH, forwarded=True)
    assert classify("GET", "/v1/models/m/predict") == Upstream(Route.MODEL, "m", "POST", INVOKE_PATH, forwarded=True)


def test_health_server_metadata_and_the_repository_are_answered_by_the_picker():
    assert classify("GET", "/healthz") == Answered(Route.OPEN, Local.LIVE)
    assert classify("GET", "/v2/health/ready") == Answered(Route.OPEN, Local.READY)
    assert classify("GET", "/v2") == Answered(Route.SERVER, Local.SERVER)
    assert classify("POST", "/v2/repository/index") == Answered(Route.INDEX, Local.INDEX)
    assert classify("POST", "/v2/repository/models/a%2Fb/load") == Answered(Route.LOAD, Local.LOAD, "a/b")
    assert classify("POST", "/v2/repository/models/m/unload") == Answered(Route.UNLOAD, Local.UNLOAD, "m")
    assert classify("GET", "/v2/models/m/versions/2/ready") == Answered(Route.MODEL, Local.MODEL_READY, "m", "2")


def test_the_routers_own_documents_are_router_only_and_unknown_oip_paths_404():
    assert classify("GET", "/v1/replicas") == Answered(Route.INTERNALS, Local.ROUTER_ONLY)
    assert classify("GET", "/openapi.json") == Answered(Route.SERVER, Local.ROUTER_ONLY)
    assert classify("GET", "/v2/nothing") == Answered(Route.SERVER, Local.NOT_FOUND)


def test_a_wrong_method_on_a_reserved_route_is_a_405_naming_the_allowed_ones():
    assert classify("GET", "/v2/models/m/infer") == Answered(Route.MODEL, Local.NOT_ALLOWED, allow="POST")
    assert classify("DELETE", "/v1/models/m/predict") == Answered(Route.MODEL, Local.NOT_ALLOWED, allow="GET, POST")
    assert classify("POST", "/v2/repository/index").what is Local.INDEX
