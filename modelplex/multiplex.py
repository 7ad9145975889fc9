"""``@multiplexed``: turn an async ``load_model(model_id)`` into a per-replica LRU model cache."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from modelplex.cache import ModelCache
from modelplex.runtime import runtime
from modelplex.spec import DEFAULT_MAX_MODELS_PER_REPLICA

_CACHES_ATTR = "__modelplex_caches__"


def multiplexed(func: Callable | None = None, *, max_num_models_per_replica: int = DEFAULT_MAX_MODELS_PER_REPLICA):
    """Cache what ``func(model_id)`` returns, keeping the ``max_num_models_per_replica`` most
    recently used models (the spec's ``multiplexing.maxModelsPerReplica`` overrides it).

    Works on methods (one cache per instance) and on plain functions (one cache per function).
    """

    def wrap(load: Callable) -> Callable:
        if not inspect.iscoroutinefunction(load):
            raise TypeError(f"@multiplexed needs an async function; {load.__qualname__} is not")
        takes_self = "self" in inspect.signature(load).parameters

        @functools.wraps(load)
        async def load_model(*args: Any) -> Any:
            owner = args[0] if takes_self else load_model
            model_id = args[-1]
            return await _cache_of(owner, load, takes_self, max_num_models_per_replica).get(model_id)

        load_model.__modelplex_multiplexed__ = (load, max_num_models_per_replica)
        return load_model

    return wrap(func) if func is not None else wrap


def _cache_of(owner: Any, load: Callable, takes_self: bool, capacity: int) -> ModelCache:
    caches = owner.__dict__.setdefault(_CACHES_ATTR, {})
    cache = caches.get(load.__name__)
    if cache is None:
        loader = functools.partial(load, owner) if takes_self else load
        cache = ModelCache(
            loader,
            runtime.max_models_per_replica or capacity,
            listener=runtime.cache_changed,
        )
        caches[load.__name__] = cache
    return cache


def find_cache(handler: Any) -> ModelCache | None:
    """The model cache of a handler instance: the one ``@multiplexed`` method, made ready."""
    for _, member in inspect.getmembers(type(handler)):
        declared = getattr(member, "__modelplex_multiplexed__", None)
        if declared is not None:
            load, capacity = declared
            return _cache_of(handler, load, True, capacity)
    return None
