"""The per-replica multiplexed model cache: a count and a byte budget, bounded loads, a warm tier.

Past Ray Serve's cache:
- loads of *different* models run in parallel, up to ``max_concurrent_loads`` (and at most
  ``capacity``) at once; the loads waiting for a slot start in the order they were asked for,
  and one whose callers have all gone before it started is dropped; the same model requested
  concurrently loads once;
- with a byte budget (``max_bytes``), a load first reserves its expected size (the last
  measured size of that id, else what the loader declares with :meth:`LoadContext.expect`,
  else the mean measured size of the deployment, else nothing) and evicts idle models until
  the reservation fits, so concurrent loads never overcommit memory; the reservation becomes
  the model's measured size (``size_of``) when it is in. A measured size over the whole budget
  is refused (:class:`ModelTooLarge`) and remembered, so the next request is refused at once;
- a load that runs longer than ``load_timeout_s`` (counted from when it gets its slot) is
  abandoned: not cached, every waiter gets :class:`ModelLoadTimeout` (504), the next request
  retries;
- a model pinned by requests in flight is never unloaded under them: eviction skips it, and
  if every loaded model is busy the cache runs over capacity until one goes idle;
- with the count capacity alone, the victim is chosen when the new model is in, not when its
  load starts: models used during a slow load stay (evicting first cost a third of the hits on
  a Zipf trace: bench/results/experiment_cache.txt). Bytes are evicted before a load, because
  memory that is not there cannot be borrowed;
- the victim is the least recently used idle model (``policy="lru"``, Ray's) or the least
  requested recently (``"lfu"``: request counts that halve every :data:`LFU_HALF_LIFE_S`, so
  a once-hot model does not stay forever);
- a model *leased* with :meth:`ModelCache.lease` (``spec.models`` ``minCopies``: the routers
  renew the leases of the copies they place) is never evicted while its lease runs, and counts
  against the capacity and the bytes like any model; when leased models fill the cache, a load
  of another model is refused (:class:`PinsFillCache`, 503) rather than evicting one. A lease
  that is not renewed runs out, so a copy whose owner placed it elsewhere frees itself;
- an evicted model may go to a warm tier (host memory) and come back from it by a copy; such
  a load needs no load slot and its waiters are never turned away;
- a failed load is not cached, and every waiter gets the error; the cache remembers the latest
  failure of each of the last ids that failed (:attr:`ModelCache.failures`, reported in the
  replica's loaded-models document, where the operator turns them into Events). Failures move
  :attr:`ModelCache.version` at most once per :data:`FAILURE_VERSION_INTERVAL_S`, so a stream
  of bogus ids does not drive a document read (and an API write) per request;
- ids that do not exist cost no memory and no refetch: an id without a measured size reserves
  only room that is free before its loader runs (it evicts once the loader declares a size
  with :meth:`LoadContext.expect`, i.e. after it found the model, or when the model lands),
  and a :class:`ModelNotFound` is remembered for ``not_found_ttl_s`` (the next requests for
  that id get it at once, without a load).

The cache is pure: sizes come from a ``size_of(model_id, model)`` hook the replica gives it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Literal, Protocol

from modelplex.wire.errors import (ModelLoadError, ModelLoadTimeout, ModelNotFound, ModelplexError, ModelTooLarge,
                                   Overloaded)
from modelplex.wire.loaded import MAX_ERROR_CHARS, MAX_FAILURES, LoadFailure
from modelplex.wire.redact import redact_text
from modelplex.wire.spec import DEFAULT_EVICTION_POLICY, DEFAULT_NOT_FOUND_CACHE_S, EVICTION_POLICIES

log = logging.getLogger("modelplex.cache")

Loader = Callable[[str], Awaitable[Any]]
Listener = Callable[[str, str, float], None]
"""(event, model id, seconds); events: loading, loaded (cold), loaded_warm, load_failed,
load_dropped (queued, every caller gone), evicted, failures_shown (held-back failures moved the
version; model id "")."""
SizeOf = Callable[[str, Any], "int | None"]
"""The bytes a freshly loaded model occupies on its device, or None when unknown."""
LoadStarted = Callable[[str], None]
"""Called as a load begins (a CUDA sizer notes the allocator's count there)."""
Policy = Literal["lru", "lfu"]

POLICIES = EVICTION_POLICIES
#: How fast ``lfu`` forgets: a request counts half as much this many seconds later.
LFU_HALF_LIFE_S = 600.0
#: Ids whose size and request rate are remembered after they leave the cache.
REMEMBERED_IDS = 10_000
#: How long an id whose source said "no such model" is answered 404 without a load.
DEFAULT_NOT_FOUND_TTL_S = DEFAULT_NOT_FOUND_CACHE_S
#: Failed loads move ``version`` at most once this often (a document read and a pod patch each).
FAILURE_VERSION_INTERVAL_S = 10.0


class ModelInUse(ModelplexError):
    status = 409
    code = "model_in_use"


class PinsFillCache(Overloaded, code="pins_fill_cache"):
    """Leased (pinned) models take every slot or byte this load needs: 503, so a router tries
    another replica, and a spec whose pins cannot fit shows in the log and the status."""


class WarmTier(Protocol):
    """Where evicted models wait to come back by a copy (host memory next to a GPU)."""

    def holds(self, model_id: str) -> bool:
        """Whether :meth:`take` would return the model now."""

    async def keep(self, model_id: str, model: Any, nbytes: int) -> bool:
        """Take an evicted model; False when it does not fit (the cache then releases it)."""

    async def take(self, model_id: str) -> Any | None:
        """The model, back on its device and no longer held by the tier; None if it is gone."""

    async def close(self) -> None:
        """Release everything held."""


@dataclass
class _Stats:
    """What the cache remembers of an id, loaded or not."""

    nbytes: int | None = None  # last measured size
    score: float = 0.0  # requests, halved every LFU_HALF_LIFE_S
    scored_at: float = 0.0


@dataclass
class _Entry:
    model: Any
    nbytes: int


@dataclass
class _Load:
    model_id: str
    future: asyncio.Future
    task: asyncio.Task | None = None
    waiters: int = 0
    started: bool = False
    warm: bool = False
    reserved: int = 0


@dataclass
class LoadContext:
    """The load in progress, as the loader sees it through :func:`current_load`."""

    _cache: ModelCache
    _load: _Load
    tier: str = "cold"  # a loader that finds a local copy of its source says "warm"
    declared: int | None = field(default=None)

    @property
    def model_id(self) -> str:
        return self._load.model_id

    async def expect(self, nbytes: int) -> None:
        """Declare the model's expected size (e.g. its file's) before it takes device memory:
        the reservation grows to it (evicting idle models) unless the id has a measured size."""
        self.declared = nbytes
        if self._cache._stats_of(self.model_id).nbytes is None:
            await self._cache._reserve(self._load, nbytes)


_current_load: contextvars.ContextVar[LoadContext | None] = contextvars.ContextVar("modelplex_load", default=None)


def current_load() -> LoadContext | None:
    """The load a ``@multiplexed`` loader runs for (None outside the cache's loads)."""
    return _current_load.get()


class _Slots:
    """At most ``limit`` holders; waiters are served first come, first served."""

    def __init__(self, limit: int | None):
        self.free = limit
        self._queue: deque[asyncio.Future] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def acquire(self) -> None:
        if self.free is None:
            return
        if self.free > 0 and not self._queue:
            self.free -= 1
            return
        granted = asyncio.get_running_loop().create_future()
        self._queue.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # granted, then cancelled before it ran: pass the slot on
            elif granted in self._queue:
                self._queue.remove(granted)
            raise

    def release(self) -> None:
        if self.free is None:
            return
        while self._queue:
            granted = self._queue.popleft()
            if not granted.done():
                granted.set_result(None)
                return
        self.free += 1


class ModelCache:
    """Models loaded on demand by ``load``, kept within ``capacity`` models and ``max_bytes``."""

    def __init__(
        self,
        load: Loader,
        capacity: int,
        *,
        max_bytes: int | None = None,
        max_concurrent_loads: int | None = None,
        load_timeout_s: float | None = None,
        max_waiting: int | None = None,
        policy: Policy | str = DEFAULT_EVICTION_POLICY,  # checked against POLICIES below: a spec's value is a str
        size_of: SizeOf | None = None,
        load_started: LoadStarted | None = None,
        warm: WarmTier | None = None,
        listener: Listener | None = None,
        not_found_ttl_s: float = DEFAULT_NOT_FOUND_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 (got {capacity})")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1 (got {max_bytes})")
        if max_concurrent_loads is not None and max_concurrent_loads < 1:
            raise ValueError(f"max_concurrent_loads must be >= 1 (got {max_concurrent_loads})")
        if load_timeout_s is not None and load_timeout_s <= 0:
            raise ValueError(f"load_timeout_s must be > 0 (got {load_timeout_s})")
        if not_found_ttl_s < 0:
            raise ValueError(f"not_found_ttl_s must be >= 0 (got {not_found_ttl_s})")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)} (got {policy!r})")
        self.capacity = capacity
        self.capacity_bytes = max_bytes
        self.max_concurrent_loads = max_concurrent_loads
        self.load_timeout_s = load_timeout_s
        self.max_waiting = max_waiting
        self.policy = policy
        self._load = load
        self._size_of = size_of
        self._load_started = load_started
        self._warm = warm
        self._listener = listener
        self._clock = clock
        self._wall_clock = wall_clock  # only to date failures for readers
        self._models: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._loading: dict[str, _Load] = {}
        # Never more loads at once than models fit: the extra one's model would be the victim of
        # the others as they land, before its callers had used it.
        self._slots = _Slots(min(max_concurrent_loads, capacity) if max_concurrent_loads else None)
        self._stats: OrderedDict[str, _Stats] = OrderedDict()  # least recently requested first
        self._measured_sum = 0
        self._measured_count = 0
        self._pins: Counter[str] = Counter()
        self._leases: dict[str, float] = {}  # model id -> when its lease runs out (clock)
        self._changed: list[asyncio.Future] = []  # woken when memory or a model frees up
        self._background: set[asyncio.Task] = set()
        self._failures: OrderedDict[str, LoadFailure] = OrderedDict()  # latest failure per id, oldest first
        self.not_found_ttl_s = not_found_ttl_s
        self._not_found: OrderedDict[str, tuple[float, ModelNotFound]] = OrderedDict()  # id -> (until, error)
        self._failure_bumped_at: float | None = None  # when a failure last moved the version
        self._failure_pending = False  # a failure since then that the version does not show yet
        self._failure_timer: asyncio.Task | None = None  # shows pending failures when the interval ends
        self.version = 0

    # -- what the replica reports ------------------------------------------------------------

    @property
    def loaded(self) -> list[str]:
        """Loaded model ids, least recently used first."""
        return list(self._models)

    @property
    def loading(self) -> list[str]:
        return list(self._loading)

    @property
    def model_bytes(self) -> dict[str, int]:
        """Measured size of each loaded model (0 where unknown), least recently used first."""
        return {model_id: entry.nbytes for model_id, entry in self._models.items()}

    @property
    def bytes_used(self) -> int:
        """Loaded models plus the reservations of loads in flight."""
        return sum(entry.nbytes for entry in self._models.values()) + self.bytes_reserved

    @property
    def bytes_reserved(self) -> int:
        return sum(load.reserved for load in self._loading.values())

    @property
    def loads_running(self) -> int:
        return sum(1 for load in self._loading.values() if load.started)

    @property
    def loads_queued(self) -> int:
        return sum(1 for load in self._loading.values() if not load.started)

    @property
    def failures(self) -> list[LoadFailure]:
        """The latest failed load of each of the last :data:`MAX_FAILURES` ids that failed, oldest first."""
        return list(self._failures.values())

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._models

    # -- leases (pinned copies) ----------------------------------------------------------------

    def lease(self, model_ids: Iterable[str], ttl_s: float) -> None:
        """Pin each of ``model_ids`` for ``ttl_s`` seconds from now (a renewal never shortens a
        lease: two routers renewing the same copy agree). Loading them is the caller's part."""
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 (got {ttl_s})")
        until = self._clock() + ttl_s
        for model_id in model_ids:
            self._leases[model_id] = max(self._leases.get(model_id, until), until)

    def leased(self, model_id: str) -> bool:
        """Whether ``model_id``'s lease runs now (it is then never evicted)."""
        until = self._leases.get(model_id)
        if until is None:
            return False
        if until > self._clock():
            return True
        del self._leases[model_id]  # run out: the model is an ordinary one again
        return False

    @property
    def leases(self) -> dict[str, float]:
        """The running leases: model id -> seconds left."""
        now = self._clock()
        return {m: self._leases[m] - now for m in list(self._leases) if self.leased(m)}

    def _leased_held(self, besides: str) -> list[str]:
        """Leased models loaded or loading here, ``besides`` apart."""
        return [m for m in (*self._models, *self._loading) if m != besides and self.leased(m)]

    def _refuse_if_pins_fill(self, model_id: str) -> None:
        """A load needs a slot that is not a leased model's: refuse it when there is none."""
        pinned = self._leased_held(model_id)
        if len(pinned) >= self.capacity:
            raise PinsFillCache(_pins_fill(model_id, f"all {self.capacity} model slots"), retry_after=1)

    def _pinned_bytes(self, besides: _Load) -> int:
        return (sum(e.nbytes for m, e in self._models.items() if self.leased(m))
                + sum(load.reserved for load in self._loading.values() if load is not besides and self.leased(load.model_id)))

    # -- use -----------------------------------------------------------------------------------

    async def get(self, model_id: str) -> Any:
        """The model, loading it if needed; concurrent calls for one id share one load."""
        self._count_request(model_id)
        entry = self._models.get(model_id)
        if entry is not None:
            self._models.move_to_end(model_id)
            return entry.model
        load = self._loading.get(model_id)
        if load is None:
            self._refuse_if_too_large(model_id)
            self._refuse_if_known_missing(model_id)
            self._refuse_if_pins_fill(model_id)
            self._show_pending_failures()
            load = _Load(model_id, asyncio.get_running_loop().create_future())
            load.warm = self._warm is not None and self._warm.holds(model_id)
            self._loading[model_id] = load
            # The load runs in its own task: a caller that goes away does not cancel it for the others.
            load.task = self._spawn(self._run(load))
            self._notify("loading", model_id, 0.0)
        elif self.max_waiting is not None and load.waiters >= self.max_waiting and not load.warm:
            raise Overloaded(f"{load.waiters} requests already wait for model {model_id!r} to load "
                             f"(maxOngoingRequests)", retry_after=1)
        load.waiters += 1
        try:
            return await asyncio.shield(load.future)
        finally:
            load.waiters -= 1
            if load.waiters == 0 and not load.started and not load.future.done():
                self._abandon(load)

    def pinned(self, model_id: str):
        """Mark ``model_id`` in use for the duration of a request: it is not evicted meanwhile."""
        return _Pin(self, model_id)

    async def evict(self, model_id: str, *, timeout: float = 30.0) -> bool:
        """Unload ``model_id`` once no request uses it; False if it was not loaded. A leased
        model is refused (409): its copy is declared (``spec.models`` ``minCopies``)."""
        if model_id not in self._models:
            return False
        if self.leased(model_id):
            raise ModelInUse(f"model {model_id!r} is pinned here (spec.models minCopies); it is unloaded "
                             "when its lease runs out, once the routers place it elsewhere")
        try:
            async with asyncio.timeout(timeout):
                while self._pins[model_id] > 0:
                    await self._wait_for_change()
        except TimeoutError:
            raise ModelInUse(f"model {model_id!r} is still serving requests after {timeout:g} s") from None
        if model_id not in self._models:
            return False
        await self._unload(model_id, to_warm=False)
        return True

    async def close(self) -> None:
        """Unload everything (replica shutdown) and stop background work."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for model_id in list(self._models):
            await self._unload(model_id, to_warm=False)
        if self._warm is not None:
            await self._warm.close()

    # -- loads ---------------------------------------------------------------------------------

    def _spawn(self, coroutine: Awaitable[None]) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _abandon(self, load: _Load) -> None:
        """Every caller left before the load began: drop it (it never took memory)."""
        del self._loading[load.model_id]
        load.future.cancel()
        if load.task is not None:
            load.task.cancel()
        log.info("Dropped the queued load of model %r: every caller has gone.", load.model_id)
        self._notify("load_dropped", load.model_id, 0.0)

    async def _run(self, load: _Load) -> None:
        model_id = load.model_id
        context = LoadContext(self, load, tier="warm" if load.warm else "cold")
        slot = False
        started = self._clock()
        try:
            if not load.warm:
                await self._slots.acquire()
                slot = True
            load.started = True
            log.info("Loading model %r%s.", model_id, " from the warm tier" if load.warm else "")
            started = self._clock()
            deadline = asyncio.timeout(self.load_timeout_s)
            try:
                async with deadline:
                    model = await self._fetch(load, context)
            except TimeoutError:
                if not deadline.expired():
                    raise  # the loader's own timeout, not ours
                raise ModelLoadTimeout(
                    f"loading model {model_id!r} took longer than loadTimeoutSeconds "
                    f"({self.load_timeout_s:g} s); it is not cached and the next request tries again") from None
            nbytes = self._measure(model_id, model, load)
        except BaseException as error:  # noqa: BLE001 - every waiter must hear about it
            self._failed(load, error, self._clock() - started)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        finally:
            if slot:
                self._slots.release()
        seconds = self._clock() - started
        if self._loading.get(model_id) is load:
            del self._loading[model_id]
        self._models[model_id] = _Entry(model, nbytes)
        self.version += 1
        self._wake()  # its reservation is now its size, and it may be the next victim
        log.info("Loaded model %r in %.3f s (%s, %s).", model_id, seconds, context.tier,
                 _human(nbytes) if nbytes else "size unknown")
        self._notify("loaded_warm" if context.tier == "warm" else "loaded", model_id, seconds)
        await self._make_room(keep=model_id)
        if not load.future.done():
            load.future.set_result(model)

    async def _fetch(self, load: _Load, context: LoadContext) -> Any:
        """The model from the warm tier, else from the loader, inside its byte reservation.

        An id measured before exists: its room is made (evicting) before the loader runs. An id
        never measured may not exist at all: it takes only free room now, and evicts when its
        loader declares a size (after finding the model) or when it lands."""
        if load.warm or self._stats_of(load.model_id).nbytes is not None:
            await self._reserve(load, self._expected(load.model_id))
        else:
            self._reserve_free(load, self._expected(load.model_id))
        if load.warm and self._warm is not None:  # (only a cache with a warm tier marks a load warm)
            model = await self._warm.take(load.model_id)
            if model is not None:
                return model
            context.tier = "cold"  # dropped from the tier meanwhile: a full load after all
        if self._load_started is not None:
            self._load_started(load.model_id)
        token = _current_load.set(context)
        try:
            return await self._load(load.model_id)
        finally:
            _current_load.reset(token)

    def _measure(self, model_id: str, model: Any, load: _Load) -> int:
        measured = self._size_of(model_id, model) if self._size_of is not None else None
        if measured is None:
            return load.reserved  # unknown: keep counting what was reserved
        self._remember_size(model_id, measured)
        if self.capacity_bytes is not None and measured > self.capacity_bytes:
            self._spawn(release(model, model_id))
            raise ModelTooLarge(_too_large(model_id, measured, self.capacity_bytes))
        return measured

    def _failed(self, load: _Load, error: BaseException, seconds: float) -> None:
        model_id = load.model_id
        if self._loading.get(model_id) is load:
            del self._loading[model_id]
        load.reserved = 0
        self._wake()
        if load.future.done():
            return  # abandoned: nobody waits
        if isinstance(error, asyncio.CancelledError):
            load.future.cancel()
            return
        if isinstance(error, ModelNotFound) and self.not_found_ttl_s > 0:
            self._remember_missing(model_id, error)
        log.warning("Loading model %r failed after %.3f s: %s", model_id, seconds, redact_text(str(error)))
        if not isinstance(error, ModelplexError):
            error = ModelLoadError(f"loading model {model_id!r} failed: {error!r}")
        load.future.set_exception(error)
        load.future.exception()  # mark retrieved: there may be no waiter left
        self._remember_failure(model_id, str(error))
        self._notify("load_failed", model_id, seconds)

    def _remember_failure(self, model_id: str, message: str) -> None:
        previous = self._failures.pop(model_id, None)
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._wall_clock()))
        # A loader's message may name its source: the failure reaches clients and Events redacted.
        self._failures[model_id] = LoadFailure(model_id, redact_text(message)[:MAX_ERROR_CHARS], at,
                                               previous.count + 1 if previous else 1)
        while len(self._failures) > MAX_FAILURES:
            self._failures.popitem(last=False)
        self._failure_pending = True
        self._show_pending_failures()

    def _show_pending_failures(self) -> None:
        """Move the version for failures not shown yet, at most once per interval: readers of the
        summary fetch the document (and patch the pod) then, not once per failed load. A
        failure held back shows with the next load, eviction or failure after the interval."""
        if not self._failure_pending:
            return
        now = self._clock()
        if self._failure_bumped_at is not None and now - self._failure_bumped_at < FAILURE_VERSION_INTERVAL_S:
            if self._failure_timer is None or self._failure_timer.done():
                delay = self._failure_bumped_at + FAILURE_VERSION_INTERVAL_S - now
                self._failure_timer = self._spawn(self._show_failures_after(delay))
            return
        self._failure_bumped_at = now
        self._failure_pending = False
        self.version += 1

    async def _show_failures_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._failure_pending:
            self._show_pending_failures()
            self._notify("failures_shown", "", 0.0)

    def _remember_missing(self, model_id: str, error: ModelNotFound) -> None:
        self._not_found.pop(model_id, None)
        self._not_found[model_id] = (self._clock() + self.not_found_ttl_s, error)
        while len(self._not_found) > REMEMBERED_IDS:
            self._not_found.popitem(last=False)

    def _refuse_if_known_missing(self, model_id: str) -> None:
        """404 at once for an id its source said it does not have, within ``not_found_ttl_s``."""
        remembered = self._not_found.get(model_id)
        if remembered is None:
            return
        until, error = remembered
        if self._clock() < until:
            raise ModelNotFound(error.message)
        del self._not_found[model_id]

    def _refuse_if_too_large(self, model_id: str) -> None:
        stats = self._stats.get(model_id)
        if self.capacity_bytes is not None and stats is not None and stats.nbytes is not None \
                and stats.nbytes > self.capacity_bytes:
            raise ModelTooLarge(_too_large(model_id, stats.nbytes, self.capacity_bytes))

    # -- bytes ---------------------------------------------------------------------------------

    def _expected(self, model_id: str) -> int:
        measured = self._stats_of(model_id).nbytes
        if measured is not None:
            return measured
        return self._measured_sum // self._measured_count if self._measured_count else 0

    async def _reserve(self, load: _Load, nbytes: int) -> None:
        """Grow ``load``'s reservation to ``nbytes`` (at most the budget), evicting idle models
        until it fits and waiting while it cannot."""
        if self.capacity_bytes is not None:
            nbytes = min(nbytes, self.capacity_bytes)
        while nbytes > load.reserved:
            if self.capacity_bytes is None or self.bytes_used - load.reserved + nbytes <= self.capacity_bytes:
                load.reserved = nbytes
                return
            victim = self._victim()
            if victim is None:
                budget = self.capacity_bytes  # (not None here: a cache without one always fits)
                if budget is not None and self._pinned_bytes(load) + nbytes > budget:
                    # Leased models hold the bytes and never leave: waiting would wait forever.
                    raise PinsFillCache(_pins_fill(load.model_id, f"the model memory ({_human(budget)})"))
                # Every byte serves a request or a load. Nothing of this load is on the device
                # yet, so it holds no reservation while it waits: two loads that each want to
                # grow past what is left never wait for each other.
                if load.reserved:
                    load.reserved = 0
                    self._wake()
                await self._wait_for_change()
            else:
                await self._unload(victim, to_warm=True)

    def _reserve_free(self, load: _Load, nbytes: int) -> None:
        """Reserve up to ``nbytes`` of what is free now, evicting nothing."""
        if self.capacity_bytes is not None:
            nbytes = max(0, min(nbytes, self.capacity_bytes - (self.bytes_used - load.reserved)))
        load.reserved = max(load.reserved, nbytes)

    def _over(self) -> bool:
        if len(self._models) > self.capacity:
            return True
        return self.capacity_bytes is not None and self.bytes_used > self.capacity_bytes

    async def _make_room(self, keep: str | None = None) -> None:
        """Evict idle models until the loaded ones fit the count and the bytes."""
        while self._over():
            victim = self._victim(keep)
            if victim is None:
                return  # every loaded model serves a request: evict when one goes idle
            await self._unload(victim, to_warm=True)

    def _victim(self, keep: str | None = None) -> str | None:
        idle = [m for m in self._models if self._pins[m] == 0 and m != keep and not self.leased(m)]
        if not idle:
            return None
        if self.policy == "lru":
            return idle[0]
        now = self._clock()
        return min(idle, key=lambda m: self._score(self._stats_of(m), now))  # min keeps LRU order on ties

    # -- per-id memory: sizes and request rates ------------------------------------------------

    def _stats_of(self, model_id: str) -> _Stats:
        stats = self._stats.get(model_id)
        if stats is None:
            stats = self._stats[model_id] = _Stats(scored_at=self._clock())
            while len(self._stats) > REMEMBERED_IDS:
                forgotten_id = next(iter(self._stats))
                if forgotten_id in self._models or forgotten_id in self._loading:
                    self._stats.move_to_end(forgotten_id)
                    continue
                forgotten = self._stats.pop(forgotten_id)
                if forgotten.nbytes is not None:
                    self._measured_sum -= forgotten.nbytes
                    self._measured_count -= 1
        return stats

    def _remember_size(self, model_id: str, nbytes: int) -> None:
        stats = self._stats_of(model_id)
        if stats.nbytes is not None:
            self._measured_sum -= stats.nbytes
            self._measured_count -= 1
        stats.nbytes = nbytes
        self._measured_sum += nbytes
        self._measured_count += 1

    def _count_request(self, model_id: str) -> None:
        stats = self._stats_of(model_id)
        self._stats.move_to_end(model_id)
        now = self._clock()
        stats.score = self._score(stats, now) + 1.0
        stats.scored_at = now

    @staticmethod
    def _score(stats: _Stats, now: float) -> float:
        return stats.score * math.exp2(-(now - stats.scored_at) / LFU_HALF_LIFE_S)

    # -- unloading -----------------------------------------------------------------------------

    async def _unload(self, model_id: str, *, to_warm: bool) -> None:
        entry = self._models.pop(model_id)
        self.version += 1
        log.info("Unloading model %r.", model_id)
        started = self._clock()
        kept = False
        if to_warm and self._warm is not None:
            try:
                kept = await self._warm.keep(model_id, entry.model, entry.nbytes)
            except Exception:  # noqa: BLE001 - the model is then released as usual
                log.exception("moving model %r to the warm tier failed", model_id)
        if not kept:
            await release(entry.model, model_id)
        del entry  # the last reference: CPython runs __del__ now
        seconds = self._clock() - started
        log.info("Unloaded model %r%s in %.3f s.", model_id, " to the warm tier" if kept else "", seconds)
        self._notify("evicted", model_id, seconds)
        self._wake()

    # -- change notifications ------------------------------------------------------------------

    async def _wait_for_change(self) -> None:
        changed = asyncio.get_running_loop().create_future()
        self._changed.append(changed)
        try:
            await changed
        finally:
            if changed in self._changed:
                self._changed.remove(changed)

    def _wake(self) -> None:
        """Memory was freed or a model went idle: waiting reservations and evictions look again."""
        waiting, self._changed = self._changed, []
        for changed in waiting:
            if not changed.done():
                changed.set_result(None)

    def _unpinned(self, model_id: str) -> None:
        self._wake()
        if self._over():
            self._spawn(self._make_room())

    def _notify(self, event: str, model_id: str, seconds: float) -> None:
        if self._listener is not None:
            try:
                self._listener(event, model_id, seconds)
            except Exception:  # noqa: BLE001
                log.exception("cache listener failed on %s %r", event, model_id)


class _Pin:
    """``with cache.pinned(model_id):`` keeps the model loaded while a request uses it."""

    __slots__ = ("cache", "model_id")

    def __init__(self, cache: ModelCache, model_id: str):
        self.cache = cache
        self.model_id = model_id

    def __enter__(self) -> None:
        self.cache._pins[self.model_id] += 1

    def __exit__(self, *exc: Any) -> None:
        pins = self.cache._pins
        pins[self.model_id] -= 1
        if pins[self.model_id] <= 0:
            del pins[self.model_id]
            self.cache._unpinned(self.model_id)


async def release(model: Any, model_id: str = "") -> None:
    """Call the model's ``unload()`` (sync or async) if it has one, and its ``__del__`` now, as
    Ray's unload does: an ``async def`` one awaited (the interpreter would only create its
    coroutine), a plain one called (at eviction, even where a reference outlives it; its error
    logged with the model's id, not printed as an ignored exception); never raises. Either way
    the interpreter's own call at collection then does nothing: it runs once."""
    unload = getattr(model, "unload", None)
    try:
        if callable(unload):
            result = unload()
            if inspect.isawaitable(result):
                await result
    except Exception:  # noqa: BLE001 - a broken unload() must not wedge the cache
        log.exception("unloading model %r raised", model_id)
    finaliser = getattr(type(model), "__del__", None)
    if finaliser is None:
        return
    try:
        if inspect.iscoroutinefunction(finaliser):
            await model.__del__()
        else:
            model.__del__()
    except Exception:  # noqa: BLE001 - as a broken unload()
        log.exception("unloading model %r raised", model_id)
    finally:
        _finalised(model)


def _finalised(model: Any) -> None:
    """Mark a model whose ``__del__`` ran: the interpreter's own call at collection would run a
    plain one twice, or create a coroutine nobody awaits (a warning), so it finds a no-op instead."""
    cls = type(model)
    quiet = _QUIET.get(cls)
    if quiet is None:
        quiet = _QUIET[cls] = type(cls.__name__, (cls,), {"__del__": lambda self: None, "__module__": cls.__module__})
    try:
        model.__class__ = quiet
    except TypeError:  # a class whose instances cannot change class: the warning stays
        log.debug("cannot silence %s.__del__ after it ran", cls.__qualname__)


#: Per model class, its subclass whose ``__del__`` does nothing (model classes are few).
_QUIET: dict[type, type] = {}


def _too_large(model_id: str, nbytes: int, budget: int) -> str:
    return (f"model {model_id!r} takes {_human(nbytes)}, more than the replica's whole model memory "
            f"({_human(budget)}, spec.multiplexing.maxModelBytes / memoryFraction)")


def _pins_fill(model_id: str, what: str) -> str:
    return (f"cannot load model {model_id!r}: pinned models (spec.models minCopies) take {what} of this "
            "replica; lower minCopies, or raise maxModelsPerReplica or the replicas")


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes} B"
