"""The router's OpenAPI 3 document, generated from the app's routes.

Every route the app registers must have an entry in :data:`OPERATIONS` (and every entry a
route): :func:`openapi_document` raises otherwise, so the document cannot drift from the code
(``tests/unit/router/test_openapi.py`` builds it for a fresh app).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from aiohttp import web

from modelplex.wire.ids import MAX_MODEL_ID_LENGTH as MODEL_ID_MAX_LENGTH
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.oip import DATATYPES, HEADER_LENGTH

_JSON = "application/json"


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


_NATIVE_ERROR = _json(_ref("Error"), "An error: `{\"error\": {\"code\", \"message\"}}`.")
_OIP_ERROR = _json(_ref("OipError"), "An Open Inference Protocol error: `{\"error\": \"...\"}`.")
_ANY = {"description": "The handler's answer: JSON, text, bytes or a stream (NDJSON, SSE)."}


def _errors(error: dict, *statuses: int) -> dict:
    return {str(s): error for s in statuses}


_MODEL = {"name": "model", "in": "path", "required": True,
          "schema": {"type": "string", "minLength": 1, "maxLength": MODEL_ID_MAX_LENGTH},
          "description": "The model id (`/` percent-encoded)."}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "The model version; every model has one, `1`."}
_MODEL_HEADER = {"name": MODEL_ID_HEADER, "in": "header", "required": False,
                 "schema": {"type": "string", "maxLength": MODEL_ID_MAX_LENGTH},
                 "description": "The model to use (also accepted as `serve-multiplexed-model-id`); required by "
                                "deployments that serve many models."}
_ON_COLD = {"name": "x-modelplex-on-cold", "in": "header", "required": False,
            "schema": {"type": "string", "enum": ["hold", "reject"]},
            "description": "When no ready replica has the model loaded: `hold` waits for the load, `reject` answers "
                           "503 `model_not_loaded` at once and starts the load; default: the model's `onCold`."}
#: The handler's sub-paths: every one but the router's own (``modelplex_router.app.RESERVED``),
#: whose other methods answer 405 with ``Allow``.
_TAIL = {"name": "path", "in": "path", "required": True,
         "schema": {"type": "string", "pattern": "^(?!(?:healthz|readyz|v2)$)[a-z][a-z0-9-]*$"},
         "description": "Any sub-path but the router's own (`healthz`, `readyz`, `openapi.json`, `v1/replicas`, "
                        "`v1/load`, `v2/...`): the whole route prefix `/` reaches the handler."}

#: 401 and 403: with router auth on (a missing or wrong token; a model outside the client's globs),
#: and 403 for a method-call envelope from outside the deployment; 429 a spent load quota.
_HANDLER_ANSWERS = {"200": _ANY, **_errors(_NATIVE_ERROR, 400, 401, 403, 404, 408, 413, 429, 500, 502, 503, 504)}
_HANDLER_BODY = {"required": False, "content": {
    _JSON: {"schema": {}}, "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}


def _handler_operation(summary: str, *, body: bool, tail: bool = False) -> dict:
    operation: dict[str, Any] = {"summary": summary, "tags": ["handler"],
                                 "parameters": [_MODEL_HEADER, _ON_COLD, *([_TAIL] if tail else [])],
                                 "responses": _HANDLER_ANSWERS}
    if body:
        operation["requestBody"] = _HANDLER_BODY
    return operation


_INFER = {
    "summary": "Inference (Open Inference Protocol)", "tags": ["oip"],
    "description": f"JSON tensors, or the binary tensor extension: the JSON header's length in "
                   f"`{HEADER_LENGTH}`, each binary tensor's size in `parameters.binary_data_size`.",
    "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("InferenceRequest")}}},
    "responses": {"200": _json(_ref("InferenceResponse"), "The outputs."),
                  **_errors(_OIP_ERROR, 400, 401, 403, 404, 408, 413, 429, 500, 502, 503, 504)},
}
_METADATA = {"summary": "Model metadata", "tags": ["oip"],
             "responses": {"200": _json(_ref("ModelMetadata"), "The model's metadata (it loads if needed)."),
                           **_errors(_OIP_ERROR, 400, 401, 403, 404, 500, 502, 503, 504)}}
_READY = {"summary": "Model ready: loaded on a replica, or loadable", "tags": ["oip"],
          "responses": {"200": _json(_ref("ModelReady"), "The model can be served."),
                        **_errors(_OIP_ERROR, 400, 401, 403, 404, 500, 502, 503, 504)}}

#: (method, aiohttp canonical path) → (OpenAPI path, operation).
OPERATIONS: dict[tuple[str, str], list[tuple[str, dict]]] = {
    ("GET", "/healthz"): [("/healthz", {"summary": "Liveness", "tags": ["operations"],
                                        "responses": {"200": _json(_ref("Status"), "The router is up.")}})],
    ("GET", "/readyz"): [("/readyz", {"summary": "Readiness: a replica is ready", "tags": ["operations"],
                                      "responses": {"200": _json(_ref("Readiness"), "Ready."),
                                                    "503": _json(_ref("Readiness"), "No replica is ready.")}})],
    ("GET", "/openapi.json"): [("/openapi.json", {"summary": "This document", "tags": ["operations"],
                                                  "responses": {"200": _json({"type": "object"}, "OpenAPI 3.")}})],
    ("GET", "/v1/replicas"): [("/v1/replicas", {"summary": "The routing table", "tags": ["operations"],
                                                "responses": {"200": _json(_ref("Replicas"), "Replicas and models.")}})],
    ("GET", "/v1/load"): [("/v1/load", {"summary": "The load report the autoscaler reads", "tags": ["operations"],
                                        "responses": {"200": _json(_ref("LoadReport"), "Load now.")}})],
    ("POST", "/v1/models/{model}/predict"): [("/v1/models/{model}/predict", {
        "summary": "Call the handler for a model named in the path", "tags": ["handler"], "parameters": [_MODEL, _ON_COLD],
        "requestBody": _HANDLER_BODY, "responses": _HANDLER_ANSWERS})],
    ("GET", "/v1/models/{model}/predict"): [("/v1/models/{model}/predict", {
        "summary": "Call the handler for a model named in the path, with no body (a browser's EventSource)",
        "tags": ["handler"], "parameters": [_MODEL, _ON_COLD], "responses": _HANDLER_ANSWERS})],
    ("*", "/{tail}"): [
        ("/", {"get": _handler_operation("Call the handler (no body)", body=False),
               "post": _handler_operation("Call the handler", body=True)}),
        ("/{path}", {"get": _handler_operation("Call the handler on a sub-path (no body)", body=False, tail=True),
                     "post": _handler_operation("Call the handler on a sub-path", body=True, tail=True)}),
    ],
    ("GET", "/v2"): [("/v2", {"summary": "Server metadata", "tags": ["oip"],
                              "responses": {"200": _json(_ref("ServerMetadata"), "Name, version, extensions.")}})],
    ("GET", "/v2/"): [("/v2/", {"summary": "Server metadata", "tags": ["oip"],
                                "responses": {"200": _json(_ref("ServerMetadata"), "Name, version, extensions.")}})],
    ("GET", "/v2/health/live"): [("/v2/health/live", {"summary": "Server live", "tags": ["oip"],
                                                      "responses": {"200": _json(_ref("Live"), "Live.")}})],
    ("GET", "/v2/health/ready"): [("/v2/health/ready", {"summary": "Server ready", "tags": ["oip"], "responses": {
        "200": _json(_ref("Readiness"), "Ready."), "503": _json(_ref("Readiness"), "No replica is ready.")}})],
    ("GET", "/v2/models/{model}"): [("/v2/models/{model}", {**_METADATA, "parameters": [_MODEL]})],
    ("GET", "/v2/models/{model}/versions/{version}"): [
        ("/v2/models/{model}/versions/{version}", {**_METADATA, "parameters": [_MODEL, _VERSION]})],
    ("GET", "/v2/models/{model}/ready"): [("/v2/models/{model}/ready", {**_READY, "parameters": [_MODEL]})],
    ("GET", "/v2/models/{model}/versions/{version}/ready"): [
        ("/v2/models/{model}/versions/{version}/ready", {**_READY, "parameters": [_MODEL, _VERSION]})],
    ("POST", "/v2/models/{model}/infer"): [("/v2/models/{model}/infer", {**_INFER, "parameters": [_MODEL, _ON_COLD]})],
    ("POST", "/v2/models/{model}/versions/{version}/infer"): [
        ("/v2/models/{model}/versions/{version}/infer", {**_INFER, "parameters": [_MODEL, _VERSION, _ON_COLD]})],
    ("POST", "/v2/repository/index"): [("/v2/repository/index", {
        "summary": "Models held by the replicas", "tags": ["oip"],
        "requestBody": {"required": False, "content": {_JSON: {"schema": {"type": "object"}}}},
        "responses": {"200": _json({"type": "array", "items": _ref("RepositoryModel")}, "Models and states.")}})],
    ("POST", "/v2/repository/models/{model}/load"): [("/v2/repository/models/{model}/load", {
        "summary": "Load a model on the replica its requests go to", "tags": ["oip"], "parameters": [_MODEL],
        "responses": {"200": _json(_ref("RepositoryModel"), "Loaded."),
                      **_errors(_OIP_ERROR, 400, 401, 403, 404, 500, 502, 503, 504)}})],
    ("POST", "/v2/repository/models/{model}/unload"): [("/v2/repository/models/{model}/unload", {
        "summary": "Evict a model from every replica", "tags": ["oip"], "parameters": [_MODEL],
        "responses": {"200": _json(_ref("RepositoryModel"), "Unloaded."),
                      **_errors(_OIP_ERROR, 400, 401, 403, 502)}})],
}

_PARAMETERS = {"type": "object", "additionalProperties": True}
_TENSOR_DATA = {"type": "array", "items": {}}
_SHAPE = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_DATATYPE = {"type": "string", "enum": list(DATATYPES)}

SCHEMAS: dict[str, dict] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
    "OipError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "Status": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
    "Live": {"type": "object", "required": ["live"], "properties": {"live": {"type": "boolean"}}},
    "Readiness": {"type": "object", "required": ["ready"], "properties": {
        "ready": {"type": "boolean"}, "replicas": {"type": "integer"}, "ready_replicas": {"type": "integer"}}},
    "Replicas": {"type": "object", "required": ["deployment", "replicas"], "properties": {
        "deployment": {"type": "string"}, "policy": {"type": "string"}, "queued": {"type": "integer"},
        "replicas": {"type": "array", "items": {"type": "object"}}}},
    "LoadReport": {"type": "object", "required": ["deployment", "at", "queued", "replicas", "model_rates"],
                   "description": "modelplex.wire.load.LoadReport: this router's requests at each replica "
                                  "(in its slots or waiting for a load), its queue (requests held at zero "
                                  "replicas included), and each model's requests per second over window_s.",
                   "properties": {
        "deployment": {"type": "string"}, "router": {"type": "string"},
        "at": {"type": "number", "description": "Unix time of the report."},
        "queued": {"type": "integer", "minimum": 0}, "ongoing": {"type": "integer", "minimum": 0},
        "window_s": {"type": "number"},
        "replicas": {"type": "array", "items": {"type": "object", "required": ["name", "ongoing"], "properties": {
            "name": {"type": "string"}, "ongoing": {"type": "integer", "minimum": 0}, "ready": {"type": "boolean"},
            "models": {"type": "array", "items": {"type": "string"}}, "capacity": {"type": "integer"}}}},
        "model_rates": {"type": "object", "additionalProperties": {"type": "number"}}}},
    "ServerMetadata": {"type": "object", "required": ["name", "version", "extensions"], "properties": {
        "name": {"type": "string"}, "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}}}},
    "TensorMetadata": {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"type": "string"}, "datatype": _DATATYPE, "shape": {"type": "array", "items": {"type": "integer"}}}},
    "ModelMetadata": {"type": "object", "required": ["name", "platform"], "properties": {
        "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"},
        "inputs": {"type": "array", "items": _ref("TensorMetadata")},
        "outputs": {"type": "array", "items": _ref("TensorMetadata")}}},
    "ModelReady": {"type": "object", "required": ["name", "ready"], "properties": {
        "name": {"type": "string"}, "ready": {"type": "boolean"}}},
    "RepositoryModel": {"type": "object", "required": ["name", "state"], "properties": {
        "name": {"type": "string"}, "version": {"type": "string"}, "state": {"type": "string"}}},
    "InferenceRequest": {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"}, "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": {"type": "object", "required": ["name", "shape", "datatype"],
                                              "properties": {"name": {"type": "string"}, "shape": _SHAPE,
                                                             "datatype": _DATATYPE, "parameters": _PARAMETERS,
                                                             "data": _TENSOR_DATA}}},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "parameters": _PARAMETERS}}}}},
    "InferenceResponse": {"type": "object", "required": ["model_name", "outputs"], "properties": {
        "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name", "shape", "datatype"],
                                               "properties": {"name": {"type": "string"}, "shape": _SHAPE,
                                                              "datatype": _DATATYPE, "parameters": _PARAMETERS,
                                                              "data": _TENSOR_DATA}}}}},
}


def routes_of(app: web.Application) -> set[tuple[str, str]]:
    """(method, canonical path) of every route the app answers (HEAD follows GET)."""
    found = set()
    for route in app.router.routes():
        if route.method != "HEAD" and route.resource is not None:  # every route of app.router has one
            found.add((route.method, route.resource.canonical))
    return found


def openapi_document(app: web.Application) -> dict:
    """The OpenAPI 3.0 document for ``app``; raises if a route is undocumented or vice versa."""
    routes = routes_of(app)
    missing = sorted(routes - OPERATIONS.keys())
    stale = sorted(OPERATIONS.keys() - routes)
    if missing or stale:
        raise RuntimeError(f"OpenAPI document out of date: undocumented routes {missing}, "
                           f"documented but absent {stale}")
    paths: dict[str, dict] = {}
    for (method, _), entries in sorted(OPERATIONS.items()):
        for path, operation in entries:
            methods = operation if method == "*" else {method.lower(): operation}
            paths.setdefault(path, {}).update(methods)
    try:
        version = metadata.version("modelplex")
    except metadata.PackageNotFoundError:
        version = "0"
    return {
        "openapi": "3.0.3",
        "info": {"title": "Modelplex router", "version": version,
                 "description": "One deployment's router: the handler's native API (Ray Serve's) and the "
                                "Open Inference Protocol v2."},
        "paths": paths,
        "components": {"schemas": SCHEMAS},
    }
