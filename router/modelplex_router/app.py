"""The router's HTTP front: the aiohttp app over a :class:`~modelplex_router.router.Router`.

Public API (README, "Router API"; the OpenAPI document at ``/openapi.json``):

- any method on ``/`` and every path under it (Ray Serve's route prefix), for the model named
  by the ``serve_multiplexed_model_id`` header (or its dashed spelling, which proxies keep);
- ``POST /v1/models/{model}/predict``;
- the Open Inference Protocol v2 under ``/v2`` (:mod:`modelplex_router.oip`);
- ``GET /healthz``, ``/readyz`` (a replica is ready), ``/v1/replicas``, ``/openapi.json`` (``/metrics`` is on
  the control port only: :mod:`modelplex_router.control`);
- ``GET /v1/load``: the load report the autoscaler reads (:mod:`modelplex_router.load`).

The router's own paths are not the handler's: a wrong method there is a 405 with ``Allow``,
an unknown path under ``/v2`` a 404.

What is HTTP's alone lives here: the middlewares (errors, CORS preflights, the access log,
authentication), the routes and the OpenAPI document. What both fronts decide is the
Router's, and so is every long-lived resource: the app holds the Router under one key and
neither starts nor stops it (:mod:`modelplex_router.server` does).
"""

from __future__ import annotations

from aiohttp import web

from modelplex.http import error_middleware, read_body
from modelplex.wire.load import LOAD_PATH
from modelplex_router import oip
from modelplex_router.access_log import access_log
from modelplex_router.auth import HANDLER_ROUTES, SERVED, access_middleware, external
from modelplex_router.browsers import add_cors_headers, preflights
from modelplex_router.door import Route
from modelplex_router.keys import ROUTER
from modelplex_router.measured import admit, measured
from modelplex_router.openapi import openapi_document
from modelplex_router.proxy import FORWARDED_REQUEST_HEADERS, REPLICA_HEADER
from modelplex_router.relayed import relayed_headers
from modelplex_router.router import Router

#: The router's own paths; everything else (any method) is the handler's.
RESERVED = r"(?!(?:healthz|readyz|openapi\.json|v1/replicas|v1/load|v2)(?:/|$)|v1/models/[^/]+/predict$)"


def create_app(router: Router) -> web.Application:
    """The HTTP API of ``router`` (started and closed by its owner, not by the app)."""
    config = router.config
    # In this order: a CORS preflight is answered before authentication, which comes before the body
    # is read (within the body timeout, by the handlers).
    app = web.Application(middlewares=[error_middleware, preflights(config.cors), access_log(config.access_log),
                                       oip.protocol_errors, access_middleware(router.access)],
                          client_max_size=config.max_request_bytes)
    app[ROUTER] = router
    routes = app.router
    routes.add_get("/healthz", healthz)
    routes.add_get("/readyz", readyz)
    routes.add_get("/openapi.json", openapi)
    routes.add_get("/v1/replicas", replicas)
    routes.add_get(LOAD_PATH, load_report)
    routes.add_post("/v1/models/{model}/predict", predict)
    # For clients that cannot send headers (a browser's EventSource): the model in the path.
    routes.add_get("/v1/models/{model}/predict", predict)
    oip.add_routes(routes, ready=readyz)
    routes.add_route("*", "/{tail:" + RESERVED + ".*}", invoke)
    # What each handler serves, for the decisions at the door (by the route a request resolved to).
    handler_routes: dict[object, Route] = {invoke: Route.MODEL, predict: Route.MODEL, replicas: Route.INTERNALS,
                                           load_report: Route.INTERNALS, **oip.HANDLER_ROUTES}
    app[HANDLER_ROUTES] = handler_routes
    app.on_response_prepare.append(_hide_routing)
    if config.cors.allow_origins:
        app.on_response_prepare.append(lambda request, response: add_cors_headers(request, response, config.cors))
    return app


async def _hide_routing(request: web.Request, response: web.StreamResponse) -> None:
    """Which replica answered is routing detail: not for external clients where auth is on."""
    if external(request, request.app[ROUTER].access):
        response.headers.popall(REPLICA_HEADER, None)


# -- inference -------------------------------------------------------------------------------


async def invoke(request: web.Request) -> web.StreamResponse:
    """Any method on ``/`` or a path under it, for the model named by the model id header.

    As in Ray Serve, a GET (a browser, ``EventSource``, Ray's docs' ``requests.get``) reaches
    the handler too, with an empty body."""
    return await _forward(request)


async def predict(request: web.Request) -> web.StreamResponse:
    """``POST`` (or ``GET``) ``/v1/models/{model}/predict``: the model named in the path; the
    method, path and query string reach the handler as sent."""
    return await _forward(request)


async def _forward(request: web.Request) -> web.StreamResponse:
    """The request for the handler, for the model decided at the door: the method, path and
    headers as sent (for a replica's serve.ingress app and route prefix) but what the router
    keeps (:mod:`modelplex_router.relayed`)."""
    router = request.app[ROUTER]
    model = request[SERVED]
    keep = not router.access.auth_on or router.config.forward_credentials
    sent = relayed_headers(request.method, request.raw_path, request.headers.items(), FORWARDED_REQUEST_HEADERS,
                           keep_credentials=keep)

    async def answer() -> web.StreamResponse:
        admit(request)
        body = await read_body(request, router.config.body_timeout_s)
        return await router.proxy.forward(request, model, body, headers=sent)

    return await measured(request, model, answer)


# -- operations ------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready while at least one replica is (:meth:`~modelplex_router.router.Router.readiness`)."""
    body = request.app[ROUTER].readiness()
    return web.json_response(body, status=200 if body["ready"] else 503)


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3 document of this API."""
    return web.json_response(openapi_document(request.app))


async def replicas(request: web.Request) -> web.Response:
    """The routing table, for people and tests."""
    router = request.app[ROUTER]
    return web.json_response({
        "deployment": router.config.deployment,
        "policy": router.scheduler.policy_name,
        "queued": router.scheduler.queued,
        "replicas": router.table.snapshot(),
        # Where this router placed the pinned copies (spec.models minCopies), and what does not fit.
        "pins": router.pins(),
    })


async def load_report(request: web.Request) -> web.Response:
    """The load report the autoscaler reads."""
    return web.Response(body=request.app[ROUTER].load_report().to_json(), content_type="application/json")
