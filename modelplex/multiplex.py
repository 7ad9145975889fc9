"""``@multiplexed``: turn an async ``load_model(model_id)`` into a per-replica LRU model cache."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from modelplex.cache import ModelCache
from modelplex.runtime import Runtime, current_runtime
from modelplex.wire.errors import BadRequest, EmptyModelId
from modelplex.wire.ids import InvalidModelId, validate_model_id
from modelplex.wire.spec import DEFAULT_MAX_MODELS_PER_REPLICA

_CACHES_ATTR = "__modelplex_caches__"


def multiplexed(func: Callable | None = None, *, max_num_models_per_replica: int = DEFAULT_MAX_MODELS_PER_REPLICA):
    """Cache what ``func(model_id)`` returns, keeping the ``max_num_models_per_replica`` most
    recently used models (the spec's ``multiplexing.maxModelsPerReplica`` overrides it).

    Works on methods (one cache per instance) and on plain functions (one cache per function).
    The loader takes the model id as its one argument; a call without one, or with anything
    but a string, is a ``TypeError`` (nothing is loaded), an empty one Ray's ``ValueError("The
    model ID cannot be empty.")`` (a 400 over HTTP), an invalid one a
    :class:`~modelplex.wire.errors.BadRequest`.
    """
    if isinstance(max_num_models_per_replica, bool) or not isinstance(max_num_models_per_replica, int):
        raise TypeError(f"max_num_models_per_replica must be an integer >= 1 (got {max_num_models_per_replica!r})")
    if max_num_models_per_replica < 1:
        raise ValueError(f"max_num_models_per_replica must be an integer >= 1 (got {max_num_models_per_replica!r})")

    def wrap(load: Callable) -> Callable:
        if not inspect.iscoroutinefunction(load):
            name = getattr(load, "__qualname__", repr(load))
            raise TypeError(f"@multiplexed needs an `async def` function or method; {name} is not one")
        parameters = list(inspect.signature(load).parameters)
        takes_self = bool(parameters) and parameters[0] == "self"
        if len(parameters) != 1 + takes_self:
            raise TypeError(f"@multiplexed loader {load.__qualname__} must take exactly one argument, the model id")

        @functools.wraps(load)
        async def load_model(*args: Any) -> Any:
            if len(args) != 1 + takes_self:
                raise TypeError(f"{load.__qualname__}() takes the model id as its one argument ({len(args) - takes_self} given)")
            owner = args[0] if takes_self else load_model
            model_id = _checked(args[-1])
            return await _cache_of(owner, load, takes_self, max_num_models_per_replica).get(model_id)

        setattr(load_model, "__modelplex_multiplexed__", (load, max_num_models_per_replica))
        return load_model

    return wrap(func) if func is not None else wrap


def _checked(model_id: Any) -> str:
    if not isinstance(model_id, str):
        raise TypeError(f"a model id is a string (got {type(model_id).__name__})")
    if not model_id:
        raise EmptyModelId()  # Ray's ValueError("The model ID cannot be empty."); over HTTP a 400
    try:
        return validate_model_id(model_id)
    except InvalidModelId as error:
        raise BadRequest(str(error)) from None


def _cache_of(owner: Any, load: Callable, takes_self: bool, capacity: int) -> ModelCache:
    caches = owner.__dict__.setdefault(_CACHES_ATTR, {})
    cache = caches.get(load.__name__)
    if cache is None:
        loader = functools.partial(load, owner) if takes_self else load
        runtime = current_runtime()
        cache = ModelCache(
            loader,
            runtime.max_models_per_replica or capacity,
            max_bytes=runtime.max_model_bytes,
            max_concurrent_loads=runtime.max_concurrent_loads,
            load_timeout_s=runtime.load_timeout_s,
            not_found_ttl_s=runtime.not_found_ttl_s,
            max_waiting=runtime.max_waiting_per_model,
            policy=runtime.eviction_policy,
            size_of=_size_hook(owner, runtime) if takes_self else runtime.model_size,
            load_started=runtime.load_started,
            warm=runtime.warm_tier,
            listener=runtime.cache_changed,
        )
        caches[load.__name__] = cache
    return cache


def _size_hook(handler: Any, runtime: Runtime):
    """The handler's own ``model_bytes(model) -> int`` (models that are not torch modules),
    else the runtime's measurement."""
    own = getattr(handler, "model_bytes", None)
    if callable(own):
        return lambda model_id, model: own(model)
    return runtime.model_size


def find_cache(handler: Any) -> ModelCache | None:
    """The model cache of a handler instance: the one ``@multiplexed`` method, made ready."""
    for _, member in inspect.getmembers(type(handler)):
        declared = getattr(member, "__modelplex_multiplexed__", None)
        if declared is not None:
            load, capacity = declared
            return _cache_of(handler, load, True, capacity)
    return None
