"""What a request for a model no ready replica holds does: wait for a load, or not; and who may
cause loads at all.

- ``onCold`` (``spec.models[].onCold``, default ``hold``), overridden per request by the
  ``x-modelplex-on-cold: hold|reject`` header (gRPC: the same key in the call's metadata).
  ``hold`` waits for the load, as always; ``reject`` answers 503 ``model_not_loaded`` with
  Retry-After at once and starts the load in the background on the replica the policy picks,
  so that a retry finds the model there. A model being loaded already is not loaded again.
  A model whose background load came back 404 (no such model) is remembered as not found for
  ``spec.multiplexing.notFoundCacheSeconds`` (5 s), as a replica remembers its own: ``reject``
  answers 404 for it meanwhile, not "a load has started" for ever.
- ``spec.router.loadQuota``: a request that would start a cold load (no ready replica holds
  the model, none is loading it) takes one of its client's loads; a client without one left
  gets 429 ``load_quota_exceeded`` with Retry-After, and no load starts. Requests for models
  a replica holds never count, nor do requests to a handler without a ``@multiplexed`` loader
  (its replicas report no model capacity: nothing is ever loaded). The client is the auth client's name, else the caller's
  address; the deployment's own components (the internal credential) are not limited.

:func:`decide` is the pure rule; :class:`ColdGate` applies it with the router's table, quota
buckets and background loads.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Sequence

from modelplex.wire.errors import BadRequest, LoadQuotaExceeded, ModelNotFound, ModelNotLoaded
from modelplex.wire.spec import DEFAULT_NOT_FOUND_CACHE_S
from modelplex_router.auth import ANONYMOUS, INTERNAL
from modelplex_router.metrics import RouterMetrics
from modelplex_router.quota import LoadQuotas
from modelplex_router.record import Replica
from modelplex_router.rules import ModelRules
from modelplex_router.table import RoutingTable

log = logging.getLogger("modelplex.router.cold")

ON_COLD_HEADER = "x-modelplex-on-cold"
ON_COLD_VALUES = ("hold", "reject")
#: Loads started in the background at once, at most (each for a different model).
MAX_BACKGROUND_LOADS = 64
#: Retry-After of a ``model_not_loaded`` answer: a load takes a second or more.
NOT_LOADED_RETRY_S = 1.0
#: Model ids remembered as not found, at most (the oldest is forgotten first).
MAX_NOT_FOUND = 10_000


class Action(enum.Enum):
    """What :func:`decide` says of a request."""

    PASS = "pass"  # route it (a holder serves it, or it waits for the load it starts)
    REJECT = "reject"  # 503 model_not_loaded: a load is already under way
    REJECT_AND_LOAD = "reject_and_load"  # 503 model_not_loaded, and start the load


def on_cold_of(header: str | None, default: str) -> str:
    """The request's cold-load policy: its header (checked: 400 naming it), else ``default``."""
    if header is None:
        return default
    value = header.strip().lower()
    if value not in ON_COLD_VALUES:
        raise BadRequest(f"{ON_COLD_HEADER} must be one of {', '.join(ON_COLD_VALUES)} (got {header[:40]!r})")
    return value


def quota_client(caller: str, address: str | None) -> str | None:
    """Whose load quota a request spends: the auth client's name, else the caller's address;
    None for the deployment's own components (the internal credential), which are not limited."""
    if caller == INTERNAL:
        return None
    return caller if caller != ANONYMOUS else (address or "unknown")


def would_load(replicas: Sequence[Replica], model: str) -> bool:
    """Whether a request for ``model`` would start a cold load: no ready replica holds it or loads it."""
    return not any(replica.holds(model) for replica in replicas)


def decide(replicas: Sequence[Replica], model: str, on_cold: str) -> Action:
    """The rule for a request for ``model`` among the ready ``replicas``, before any quota."""
    if not model or not replicas or on_cold == "hold":
        # No replica ready at all (at zero, or all starting): the request waits for one, as
        # every request does; nothing can be loaded or rejected on a replica that is not there.
        return Action.PASS
    if any(replica.loaded(model) for replica in replicas):
        return Action.PASS
    return Action.REJECT_AND_LOAD if would_load(replicas, model) else Action.REJECT


class NotFound:
    """Model ids a replica's load answered 404 for, each remembered for ``ttl_s`` (times from
    ``clock``), at most :data:`MAX_NOT_FOUND` of them."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]):
        self.ttl_s = ttl_s
        self.clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def remember(self, model: str) -> None:
        if self.ttl_s <= 0:
            return
        self._until.pop(model, None)
        self._until[model] = self.clock() + self.ttl_s
        while len(self._until) > MAX_NOT_FOUND:
            self._until.popitem(last=False)

    def __contains__(self, model: object) -> bool:
        until = self._until.get(model) if isinstance(model, str) else None
        if until is None:
            return False
        if until <= self.clock():
            del self._until[model]  # type: ignore[arg-type]
            return False
        return True


@dataclass(eq=False)
class ColdGate:
    """Applies ``onCold`` and the load quota to requests before they are routed.

    ``load(model)`` loads a model on the replica the policy picks (the proxy's load through the
    scheduler) and returns the replica's status; the gate runs it in the background, one at a
    time per model, and remembers a 404 for ``not_found_s``. ``quotas``: the load quota's
    buckets (None: no quota).
    """

    table: RoutingTable
    rules: ModelRules
    metrics: RouterMetrics
    clock: Callable[[], float]
    load: Callable[[str], Coroutine[Any, Any, int]]
    quotas: LoadQuotas | None = None
    not_found_s: float = DEFAULT_NOT_FOUND_CACHE_S
    _loads: dict[str, asyncio.Task[int]] = field(default_factory=dict)
    _not_found: NotFound = field(init=False)

    def __post_init__(self) -> None:
        self._not_found = NotFound(self.not_found_s, self.clock)

    def admit(self, model: str, client: str | None, header: str | None) -> None:
        """Let a request for ``model`` from ``client`` (None: not limited) through, or raise:
        400 (a bad header), 429 (the client's loads are spent), 503 ``model_not_loaded``."""
        on_cold = on_cold_of(header, self.rules.on_cold(model) if model else "hold")
        if not model or (on_cold == "hold" and (self.quotas is None or client is None)):
            return  # nothing to decide (the default): no pass over the replicas on every request
        # Only replicas that load models count: a handler without a @multiplexed loader reports
        # no capacity, and no request to it is ever cold.
        replicas = [replica for replica in self.table.usable(self.clock()) if replica.capacity > 0]
        action = decide(replicas, model, on_cold)
        if action is not Action.REJECT and replicas and would_load(replicas, model):
            self._take_load(client)
        if action is Action.PASS:
            return
        if model in self._not_found:
            raise ModelNotFound(f"model {model!r} was not found: a replica's load of it answered 404 within the last "
                                f"{self.not_found_s:g} s (spec.multiplexing.notFoundCacheSeconds)")
        self.metrics.cold_rejected(model)
        if action is Action.REJECT_AND_LOAD:
            log.info("model %r is not loaded on any ready replica: rejecting (onCold: reject) and loading it in "
                     "the background", model)
            self._start_load(model)
        raise ModelNotLoaded(f"model {model!r} is not loaded on any ready replica and the request asked not to "
                             f"wait ({ON_COLD_HEADER}: reject); a load has started, retry later",
                             retry_after=NOT_LOADED_RETRY_S)

    def _take_load(self, client: str | None) -> None:
        if self.quotas is None or client is None:
            return
        wait = self.quotas.take(client)
        if wait is not None:
            self.metrics.quota_refused(client)
            log.info("client %r is over its load quota: no cold load for %.1f s", client, wait)
            raise LoadQuotaExceeded(f"this client's cold loads are spent (spec.router.loadQuota: "
                                    f"{self.quotas.rate * 60:g} a minute, burst {self.quotas.burst:g}); "
                                    "requests for loaded models still pass", retry_after=wait)

    def _start_load(self, model: str) -> None:
        if model in self._loads or len(self._loads) >= MAX_BACKGROUND_LOADS:
            return  # one is under way (or too many are): a retry starts it later
        task: asyncio.Task[int] = asyncio.get_running_loop().create_task(self.load(model), name=f"cold load of {model}")
        self._loads[model] = task
        task.add_done_callback(lambda done: self._loaded(model, done))

    def _loaded(self, model: str, task: asyncio.Task[int]) -> None:
        self._loads.pop(model, None)
        if task.cancelled():
            return
        if task.exception() is not None:
            log.warning("the background load of %r failed: %s", model, task.exception())
        elif task.result() == 404:
            self._not_found.remember(model)  # reject answers 404 for it a while, as the replica would
        elif task.result() >= 400:
            log.warning("the background load of %r failed: the replica answered %d", model, task.result())

    async def close(self) -> None:
        """Cancel the background loads still running, and wait for them."""
        tasks = list(self._loads.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
