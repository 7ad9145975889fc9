"""Open Inference Protocol v2 REST on the router (KServe v2, Triton's HTTP/REST API).

- ``GET /v2``: server metadata; ``GET /v2/health/live``, ``/v2/health/ready``;
- ``GET /v2/models/M[/versions/V]``: model metadata, from a replica that loads the model;
- ``GET /v2/models/M[/versions/V]/ready``: 200 when the model is loaded on a replica or loads;
- ``POST /v2/models/M[/versions/V]/infer``: JSON or binary tensors (``Inference-Header-Content-Length``),
  passed to the replica untouched and answered as the protocol says;
- ``POST /v2/repository/index``, ``.../models/M/load``, ``.../models/M/unload``: the model
  repository extension over the replicas' caches.

Every model has one version, ``1``. Errors under ``/v2`` are the protocol's ``{"error": "..."}``.

The protocol's rules (ids and versions, the replica requests) are plain functions, and the
decisions (readiness, the repository's states, unloading) the :class:`~modelplex_router.router.Router`'s:
the gRPC front (:mod:`modelplex_router.grpc`) answers through the same ones.
"""

from __future__ import annotations

from importlib import metadata

import orjson
from aiohttp import web

from modelplex.http import error_response, read_body
from modelplex.wire.errors import ModelNotFound, ModelplexError, error_object
from modelplex.wire.ids import checked_model_id
from modelplex.wire.oip import (HEADER_LENGTH, PROTOCOL, PROTOCOL_HEADER, VERSION_HEADER, error_body, parse_header,
                                split_body)
from modelplex_router.auth import CALLER, SERVED
from modelplex_router.door import Route
from modelplex_router.endpoints import load_path, metadata_path
from modelplex_router.keys import ROUTER
from modelplex_router.measured import admit, measured

SERVER_NAME = "modelplex"
EXTENSIONS = ("binary_tensor_data", "model_repository")
VERSION = "1"


def _server_version() -> str:
    try:
        return metadata.version("modelplex")
    except metadata.PackageNotFoundError:
        return "0"


def add_routes(router: web.UrlDispatcher, *, ready) -> None:
    """The protocol's routes; ``ready`` answers ``/v2/health/ready`` (the router's readiness)."""
    router.add_get("/v2", server_metadata)
    router.add_get("/v2/", server_metadata)
    router.add_get("/v2/health/live", live)
    router.add_get("/v2/health/ready", ready)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        router.add_get(prefix, model_metadata)
        router.add_get(prefix + "/ready", model_ready)
        router.add_post(prefix + "/infer", infer)
    router.add_post("/v2/repository/index", repository_index)
    router.add_post("/v2/repository/models/{model}/load", repository_load)
    router.add_post("/v2/repository/models/{model}/unload", repository_unload)


def is_oip_path(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


@web.middleware
async def protocol_errors(request: web.Request, handler) -> web.StreamResponse:
    """Errors under ``/v2`` as ``{"error": "..."}``; every 405 with its ``Allow`` header."""
    try:
        return await handler(request)
    except ModelplexError as error:
        if not is_oip_path(request.path):
            raise
        return _error(error.status, error.message, retry_after=error.retry_after)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        allow = error.headers.get("Allow")
        if is_oip_path(request.path):
            message = (error.text or error.reason) if error.status == 413 else f"{error.reason}: {request.method} {request.path}"
            response = _error(error.status, message)
        elif error.status == 405:
            response = error_response(405, "method_not_allowed", f"{request.method} is not allowed on {request.path}")
        else:
            raise
        if allow is not None:
            response.headers["Allow"] = allow
        return response


def _error(status: int, message: str, *, retry_after: float | None = None) -> web.Response:
    response = web.Response(status=status, body=error_body(message), content_type="application/json")
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(retry_after)))
    return response


def _as_oip(response: web.StreamResponse) -> web.StreamResponse:
    """A replica's buffered answer with its native error body turned into the protocol's."""
    if response.status < 400 or not isinstance(response, web.Response):
        return response
    body = response.body if isinstance(response.body, (bytes, bytearray)) else None  # a buffered answer's bytes
    oip = _error(response.status, replica_error(body, response.reason)[0])
    for name in ("Retry-After", "X-Modelplex-Replica"):
        if name in response.headers:
            oip.headers[name] = response.headers[name]
    return oip


def replica_error(body: bytes | bytearray | None, reason: str | None) -> tuple[str, str | None]:
    """The message and code of a replica's error answer: its JSON error's, else its text (or
    ``reason``) and no code."""
    try:
        error = error_object(orjson.loads(body or b""))
    except ValueError:
        error = None
    if error is not None and "message" in error:
        code = error.get("code")
        return str(error["message"]), code if isinstance(code, str) else None
    return (body or b"").decode(errors="replace") or reason or "error", None


def model_version(model: str, version: str | None) -> tuple[str, str | None]:
    """The model id (400 unless valid) and version asked for (404 unless ``1`` or none)."""
    model = checked_model_id(model)
    if version is not None and version != VERSION:
        raise ModelNotFound(f"model {model!r} has no version {version!r} (its only version is {VERSION!r})")
    return model, version


def _model(request: web.Request) -> tuple[str, str | None]:
    """The model decided at the door (the path's, decoded once) and the version asked for."""
    return model_version(request[SERVED], request.match_info.get("version"))


def infer_headers(header_length: str | None, version: str | None) -> dict[str, str]:
    """What tells a replica that a ``/v1/invoke`` body is an OIP inference request."""
    headers = {PROTOCOL_HEADER: PROTOCOL}
    if header_length:
        headers[HEADER_LENGTH] = header_length
    if version is not None:
        headers[VERSION_HEADER] = version
    return headers


def server_metadata_document() -> dict:
    return {"name": SERVER_NAME, "version": _server_version(), "extensions": list(EXTENSIONS)}


# -- server ----------------------------------------------------------------------------------


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(server_metadata_document())


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


# -- models ----------------------------------------------------------------------------------


async def _metadata(request: web.Request, model: str) -> web.StreamResponse:
    """The model's metadata from a replica (one that holds it, else one that loads it now)."""
    response = await request.app[ROUTER].proxy.forward(
        request, model, b"", method="GET", path=metadata_path(model), buffer=True)
    return _as_oip(response)


async def model_metadata(request: web.Request) -> web.StreamResponse:
    """The model's metadata: it may load the model, so it passes ``onCold`` and the load quota."""
    model, _ = _model(request)

    async def answer() -> web.StreamResponse:
        admit(request)
        return await _metadata(request, model)

    return await measured(request, model, answer)


async def model_ready(request: web.Request) -> web.StreamResponse:
    """Ready when a replica holds the model, or loads it now (so "ready" means "servable"): a
    load it would start passes ``onCold`` and the load quota first."""
    model, _ = _model(request)
    admit(request)
    if request.app[ROUTER].held(model):
        return web.json_response({"name": model, "ready": True})
    response = await _metadata(request, model)
    if response.status >= 400:
        return response
    return web.json_response({"name": model, "ready": True})


async def infer(request: web.Request) -> web.StreamResponse:
    model, version = _model(request)

    async def answer() -> web.StreamResponse:
        router = request.app[ROUTER]
        admit(request)
        body = await read_body(request, router.config.body_timeout_s)
        header_length = request.headers.get(HEADER_LENGTH)
        parse_header(split_body(body, header_length)[0])  # a malformed request is refused here, not by a replica
        headers = infer_headers(header_length, version)
        return _as_oip(await router.proxy.forward(request, model, body, headers=headers, buffer=True))

    return await measured(request, model, answer)


# -- repository extension --------------------------------------------------------------------


async def repository_index(request: web.Request) -> web.Response:
    """Every model a replica holds (``READY``) or is loading (``LOADING``) that the caller may call."""
    states = request.app[ROUTER].repository_states(request.get(CALLER, ""))
    return web.json_response([{"name": m, "version": VERSION, "state": s} for m, s in states.items()])


async def repository_load(request: web.Request) -> web.StreamResponse:
    """Load the model on the replica the router would send its requests to."""
    model, _ = _model(request)

    async def answer() -> web.StreamResponse:
        admit(request)  # an explicit load spends its client's load quota too
        response = _as_oip(await request.app[ROUTER].proxy.forward(request, model, b"", path=load_path(model),
                                                                   buffer=True))
        if response.status >= 400:
            return response
        return web.json_response({"name": model, "state": "READY"})

    return await measured(request, model, answer)


async def repository_unload(request: web.Request) -> web.Response:
    """Evict the model from every replica that holds it."""
    model, _ = _model(request)
    await request.app[ROUTER].unload(model)
    return web.json_response({"name": model, "state": "UNAVAILABLE"})


#: What each handler serves, for the decisions at the door (:mod:`modelplex_router.door`); the
#: health routes are open by path, the server's metadata is :attr:`~modelplex_router.door.Route.SERVER`.
HANDLER_ROUTES: dict[object, Route] = {model_metadata: Route.MODEL, model_ready: Route.MODEL, infer: Route.MODEL,
                                       repository_index: Route.INDEX, repository_load: Route.LOAD,
                                       repository_unload: Route.UNLOAD}
