"""What a request a Gateway asks the picker about is, from its method and path alone: a request
the chosen replica serves (:class:`Upstream`: where on the replica, and what it must be told),
or one the picker answers itself (:class:`Answered`: health, server metadata, the repository
extension, refusals).

The paths are the router's (README, "Router API"): a model's route is the same
:class:`~modelplex_router.door.Route` as on the HTTP front, with the model id in the path decoded
once here. Routes whose answers are about this router's own state or documents
(``/openapi.json``, ``/v1/replicas``, ``/v1/load``) are the router's HTTP API's only: the picker
answers 404 naming it.

Pure functions: no I/O, no gRPC.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from urllib.parse import unquote

from modelplex_router.door import Route
from modelplex_router.endpoints import INVOKE_PATH, metadata_path


class Local(enum.Enum):
    """What the picker answers itself."""

    LIVE = "live"
    READY = "ready"
    SERVER = "server"
    INDEX = "index"
    LOAD = "load"
    UNLOAD = "unload"
    MODEL_READY = "model_ready"
    ROUTER_ONLY = "router_only"
    NOT_FOUND = "not_found"
    NOT_ALLOWED = "not_allowed"


@dataclass(frozen=True)
class Answered:
    """A request the picker answers (``what``), on ``route``, for ``path_model`` (decoded; None:
    the route names none); ``allow``: the methods a 405 names."""

    route: Route
    what: Local
    path_model: str | None = None
    version: str | None = None
    allow: str = ""


@dataclass(frozen=True)
class Upstream:
    """A request the chosen replica serves: ``method`` ``path`` on it; ``oip``: an OIP inference
    (its protocol header and version); ``forwarded``: a request for the handler, whose client
    method and raw path the replica is told (:mod:`modelplex.wire.forwarded`)."""

    route: Route
    path_model: str | None
    method: str
    path: str
    oip: bool = False
    version: str | None = None
    forwarded: bool = False


_MODEL = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<tail>/ready|/infer)?$")
_REPOSITORY = re.compile(r"^/v2/repository/models/(?P<model>[^/]+)/(?P<action>load|unload)$")
_PREDICT = re.compile(r"^/v1/models/(?P<model>[^/]+)/predict$")
_OPEN = {"/healthz": Local.LIVE, "/v2/health/live": Local.LIVE, "/readyz": Local.READY, "/v2/health/ready": Local.READY}
_ROUTER_ONLY = {"/openapi.json": Route.SERVER, "/v1/replicas": Route.INTERNALS, "/v1/load": Route.INTERNALS}


def classify(method: str, raw_path: str) -> Answered | Upstream:
    """The request ``method`` ``raw_path`` (its query string and percent-encoding as sent)."""
    path = raw_path.partition("?")[0]
    if path in _OPEN:
        return _only(method, "GET", Answered(Route.OPEN, _OPEN[path]))
    if path in _ROUTER_ONLY:
        return Answered(_ROUTER_ONLY[path], Local.ROUTER_ONLY)
    if path == "/v2" or path.startswith("/v2/"):
        return _oip(method, path)
    if (match := _PREDICT.match(path)) is not None:
        upstream = Upstream(Route.MODEL, unquote(match["model"]), "POST", INVOKE_PATH, forwarded=True)
        return _only(method, "GET, POST", upstream)
    return Upstream(Route.MODEL, None, "POST", INVOKE_PATH, forwarded=True)


def _oip(method: str, path: str) -> Answered | Upstream:
    if path in ("/v2", "/v2/"):
        return _only(method, "GET", Answered(Route.SERVER, Local.SERVER))
    if path == "/v2/repository/index":
        return _only(method, "POST", Answered(Route.INDEX, Local.INDEX))
    if (match := _REPOSITORY.match(path)) is not None:
        route = Route.LOAD if match["action"] == "load" else Route.UNLOAD
        return _only(method, "POST", Answered(route, Local(match["action"]), unquote(match["model"])))
    match = _MODEL.match(path)
    if match is None:
        return Answered(Route.SERVER, Local.NOT_FOUND)
    model, version, tail = unquote(match["model"]), match["version"], match["tail"]
    if tail == "/infer":
        return _only(method, "POST", Upstream(Route.MODEL, model, "POST", INVOKE_PATH, oip=True, version=version))
    if tail == "/ready":
        return _only(method, "GET", Answered(Route.MODEL, Local.MODEL_READY, model, version))
    return _only(method, "GET", Upstream(Route.MODEL, model, "GET", metadata_path(model), version=version))


def _only(method: str, allow: str, served: Answered | Upstream) -> Answered | Upstream:
    """``served`` when ``method`` is one of ``allow``, else a 405 naming them."""
    if method in allow.split(", "):
        return served
    return Answered(served.route, Local.NOT_ALLOWED, allow=allow)
