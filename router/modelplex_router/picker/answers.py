"""What the picker answers itself (:class:`~modelplex_router.picker.routes.Answered`), with the
router's bodies: health, server metadata, the repository extension (index, load, unload) and a
model's readiness, through the :class:`~modelplex_router.router.Router`'s decisions as its HTTP
and gRPC fronts make them; the router-only routes and unknown ones with the router's 404 and
405. Requests the picker answers never reach a replica through the Gateway."""

from __future__ import annotations

from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from modelplex.wire.errors import error_document, error_for_status
from modelplex_router import oip
from modelplex_router.endpoints import load_path, metadata_path
from modelplex_router.picker import frames
from modelplex_router.picker.routes import Answered, Local
from modelplex_router.proxy import Reply
from modelplex_router.router import Router


async def answer_locally(router: Router, target: Answered, model: str, caller: str, client: str | None, method: str,
                         raw_path: str, on_cold: str | None) -> ext.ProcessingResponse:
    """The answer to ``target`` for ``caller`` (authorized already), whose load quota is
    ``client``'s (:func:`~modelplex_router.cold.quota_client`); ``on_cold``: its header."""
    path = raw_path.partition("?")[0]
    what = target.what
    if what is Local.LIVE:
        return frames.immediate(200, {"live": True} if path.startswith("/v2") else {"status": "ok"})
    if what is Local.READY:
        body = router.readiness()
        return frames.immediate(200 if body["ready"] else 503, body)
    if what is Local.SERVER:
        return frames.immediate(200, oip.server_metadata_document())
    if what is Local.INDEX:
        states = router.repository_states(caller)
        return frames.immediate(200, [{"name": m, "version": oip.VERSION, "state": s} for m, s in states.items()])
    if what is Local.NOT_ALLOWED:
        return _error(405, "method_not_allowed", f"Method Not Allowed: {method} {path}", path, {"allow": target.allow})
    if what is Local.NOT_FOUND:
        return _error(404, "not_found", f"Not Found: {method} {path}", path)
    if what is Local.ROUTER_ONLY:
        return _error(404, "not_found", f"{path} is served by the router's HTTP API only, not through the Gateway",
                      path)
    oip.model_version(model, target.version)
    if what is Local.UNLOAD:
        await router.unload(model)
        return frames.immediate(200, {"name": model, "state": "UNAVAILABLE"})
    router.admit(target.route, model, client, on_cold)
    if what is Local.LOAD:
        await router.proxy.exchange(model, b"", {}, _checked, path=load_path(model))
        return frames.immediate(200, {"name": model, "state": "READY"})
    # A model's readiness: loaded on a replica, or it loads now ("ready" means "servable").
    if not router.held(model):
        await router.proxy.exchange(model, b"", {}, _checked, method="GET", path=metadata_path(model))
    return frames.immediate(200, {"name": model, "ready": True})


async def _checked(reply: Reply) -> Any:
    """A replica's answer, or its error as the router's (its message, its status)."""
    if reply.status >= 400:
        message, _ = oip.replica_error(reply.first, None)
        raise error_for_status(reply.status, message)
    return reply.first


def _error(status: int, code: str, message: str, path: str, headers: dict[str, str] | None = None
           ) -> ext.ProcessingResponse:
    document: Any = {"error": message} if oip.is_oip_path(path) else error_document(code, message)
    return frames.immediate(status, document, headers)
