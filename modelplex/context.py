"""The request context a handler sees: which model the current request is for, and (for a Serve API
deployment) which replica of which deployment it runs in."""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from modelplex.wire.errors import RayServeException

_model_id: ContextVar[str] = ContextVar("modelplex_model_id", default="")


def get_multiplexed_model_id() -> str:
    """The model id of the request being handled ("" when the request named none), as in Ray Serve."""
    return _model_id.get()


def set_multiplexed_model_id(model_id: str) -> Token:
    """Set the current request's model id (the runtime does this); returns a token for ``reset``."""
    return _model_id.set(model_id)


def reset_multiplexed_model_id(token: Token) -> None:
    _model_id.reset(token)


@dataclass
class ReplicaContext:
    """Ray's ``ReplicaContext``: which replica of which deployment of which application this
    code runs in, and the deployment's instance (``servable_object``: None while it is built)."""

    app_name: str
    deployment: str
    replica_tag: str
    servable_object: Any = None

    @property
    def replica_id(self) -> str:
        """Ray's newer name for the replica's identity (here the tag itself)."""
        return self.replica_tag


_replica_context: ReplicaContext | None = None


def get_replica_context() -> ReplicaContext:
    """This replica's :class:`ReplicaContext`, as Ray's ``serve.get_replica_context()`` gives it
    (in the constructor, a handler, a ``@multiplexed`` loader); outside a deployment, Ray's error."""
    if _replica_context is None:
        raise RayServeException("`serve.get_replica_context()` may only be called from within a Ray Serve deployment.")
    return _replica_context


def set_replica_context(context: ReplicaContext | None) -> None:
    """Set by the replica when it builds a Serve API deployment (None: none any more)."""
    global _replica_context
    _replica_context = context
