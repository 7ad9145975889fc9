"""What a request is, whatever front it came through: the kind of route it takes and the one
model id it will be served with.

Every front (the HTTP API, the Open Inference Protocol over REST and over gRPC) turns a request
into a :class:`Route` and a model id here, once, and every decision after that acts on those
two: model control, credentials and globs (:func:`modelplex_router.auth.authorize`), ``onCold``
and the load quota (:meth:`modelplex_router.router.Router.admit`), the access and audit log, the
metrics, and the id the replica is sent. Nothing downstream reads the path or the model-id
header again, so no encoding (``%2F`` in a path, a second header) can make one decision see a
different request than another.

Pure functions: no I/O, no aiohttp.
"""

from __future__ import annotations

import enum
from typing import Iterable, Mapping

from modelplex.wire.errors import BadRequest
from modelplex.wire.names import DASHED_MODEL_ID_HEADER, MODEL_ID_HEADER


class Route(enum.Enum):
    """The kinds of route, as far as access, quotas and the audit log go."""

    #: Liveness and readiness: anyone.
    OPEN = "open"
    #: The routing table and the load report: the deployment's own components where auth is on.
    INTERNALS = "internals"
    #: Model control: load a model (off unless ``spec.router.modelControl``; may start a load).
    LOAD = "load"
    #: Model control: unload a model (off unless ``spec.router.modelControl``).
    UNLOAD = "unload"
    #: The repository index: answered with the models the caller may call.
    INDEX = "index"
    #: A model's own route (inference, predict, the handler's paths, metadata, ready): may load it.
    MODEL = "model"
    #: Anything else: server metadata, the OpenAPI document, unknown paths.
    SERVER = "server"


#: Model control: refused while off, whatever credential was sent, and audited always.
MODEL_CONTROL = frozenset({Route.LOAD, Route.UNLOAD})
#: Routes that can start a model's load: they pass ``onCold`` and the load quota.
LOADS = frozenset({Route.MODEL, Route.LOAD})


def header_models(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The model ids a request names in its headers: Ray Serve's header, then its dashed
    spelling (which proxies that drop underscores keep), each where present and not empty."""
    return tuple(value for name in (MODEL_ID_HEADER, DASHED_MODEL_ID_HEADER) if (value := headers.get(name)))


def served_model(path_model: str | None, named: Iterable[str]) -> str:
    """The one model id a request will be served with ("" for none).

    ``path_model``: the id in the route's path, decoded once (None on a route without one);
    ``named``: the ids its model-id headers carry. Where the path names the model, a header
    may only repeat it; two headers must agree too. Anything else is a 400: the request
    would otherwise be authorized for one model and served another.
    """
    named = tuple(named)
    if path_model is not None:
        for other in named:
            if other != path_model:
                raise BadRequest(f"the model-id header names {other!r} but the path names {path_model!r}: "
                                 "send one model (the path's), or the header alone on a route without one")
        return path_model
    if len(set(named)) > 1:
        raise BadRequest(f"the model-id headers name different models ({MODEL_ID_HEADER}: {named[0]!r}, "
                         f"{DASHED_MODEL_ID_HEADER}: {named[1]!r})")
    return named[0] if named else ""
