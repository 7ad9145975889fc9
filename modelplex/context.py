"""The request context a handler sees: which model the current request is for."""

from __future__ import annotations

from contextvars import ContextVar, Token

_model_id: ContextVar[str] = ContextVar("modelplex_model_id", default="")


def get_multiplexed_model_id() -> str:
    """The model id of the request being handled ("" when the request named none), as in Ray Serve."""
    return _model_id.get()


def set_multiplexed_model_id(model_id: str) -> Token:
    """Set the current request's model id (the runtime does this); returns a token for ``reset``."""
    return _model_id.set(model_id)


def reset_multiplexed_model_id(token: Token) -> None:
    _model_id.reset(token)
