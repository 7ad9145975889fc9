"""The replica endpoints the router calls (the replica's side: ``modelplex_replica.app``)."""

from __future__ import annotations

from urllib.parse import quote

from modelplex.wire.loaded import LOADED_MODELS_PATH

#: A request for the handler (``__call__``, a method call, an OIP inference).
INVOKE_PATH = "/v1/invoke"


def model_path(model: str) -> str:
    """A model on a replica: ``DELETE`` evicts it."""
    return f"{LOADED_MODELS_PATH}/{quote(model, safe='')}"


def metadata_path(model: str) -> str:
    """A model's OIP metadata (the replica loads the model to answer)."""
    return model_path(model) + "/metadata"


def load_path(model: str) -> str:
    """``POST``: load a model."""
    return model_path(model) + "/load"
