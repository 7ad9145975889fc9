"""What the serving runtime tells the SDK: spec overrides and observers.

A replica makes its :class:`Runtime` from the spec and runs the handler inside
:func:`runtime_scope` (a context variable: the tasks and threads the handler's calls run in
carry it), so a decorator argument is overridden by the spec (DESIGN.md: "Spec values override
decorator arguments") and batches and model loads show up in that replica's metrics. Outside a
replica :func:`current_runtime` has no overrides and no observers, and the decorators use their
own arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable

from modelplex.wire.spec import DEFAULT_EVICTION_POLICY, DEFAULT_NOT_FOUND_CACHE_S

BatchObserver = Callable[[str, int, float], None]
"""(model id, batch size, seconds the first request waited) for every batch."""

CacheObserver = Callable[[str, str, float], None]
"""(event, model id, seconds) with event in "loading", "loaded" (cold), "loaded_warm",
"load_failed", "load_dropped", "evicted"."""


@dataclass
class Runtime:
    """One replica's settings and observers, as the SDK reads them (see :func:`current_runtime`)."""

    max_models_per_replica: int | None = None
    #: spec.maxOngoingRequests: what @batch checks its batch size against (a warning when batches cannot fill).
    max_ongoing_requests: int | None = None
    max_batch_size: int | None = None
    batch_wait_timeout_s: float | None = None
    # The model cache (spec.multiplexing); None leaves the cache unbounded in that respect.
    max_model_bytes: int | None = None
    max_concurrent_loads: int | None = None
    load_timeout_s: float | None = None
    not_found_ttl_s: float = DEFAULT_NOT_FOUND_CACHE_S  # spec.multiplexing.notFoundCacheSeconds
    max_waiting_per_model: int | None = None
    eviction_policy: str = DEFAULT_EVICTION_POLICY
    #: sizes of loaded models and the warm tier, from the replica (modelplex_replica.sizes/warm):
    #: ``model_size(model_id, model) -> bytes | None``, ``load_started(model_id)``.
    model_size: Callable[[str, Any], int | None] | None = None
    load_started: Callable[[str], None] | None = None
    warm_tier: Any = None
    host_cache_bytes: int = 0  # the warm tier's bound (a loader's disk copy on CPU)
    batch_observers: list[BatchObserver] = field(default_factory=list)
    cache_observers: list[CacheObserver] = field(default_factory=list)

    def batch_done(self, model_id: str, size: int, waited_s: float) -> None:
        for observer in self.batch_observers:
            observer(model_id, size, waited_s)

    def cache_changed(self, event: str, model_id: str, seconds: float) -> None:
        for observer in self.cache_observers:
            observer(event, model_id, seconds)


_CURRENT: ContextVar[Runtime] = ContextVar("modelplex_runtime")
#: What the SDK sees outside a replica: nothing overridden, nobody observing. Never filled in.
_OUTSIDE = Runtime()


def current_runtime() -> Runtime:
    """The runtime of the replica whose handler this code runs for (defaults outside one)."""
    return _CURRENT.get(_OUTSIDE)


@contextmanager
def runtime_scope(runtime: Runtime) -> Iterator[Runtime]:
    """Run the block, and every task and ``asyncio.to_thread`` it starts, with ``runtime``."""
    token = _CURRENT.set(runtime)
    try:
        yield runtime
    finally:
        _CURRENT.reset(token)
