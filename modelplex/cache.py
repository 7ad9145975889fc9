"""The per-replica multiplexed model cache: LRU, single-flight, parallel loads, safe eviction.

Past Ray Serve's cache:
- loads of *different* models run in parallel (Ray serializes all loads under one lock);
  the same model requested concurrently still loads once;
- a model pinned by requests in flight is never unloaded under them: eviction skips it, and
  if every loaded model is busy the cache runs over capacity until one goes idle;
- the victim is chosen when the new model is in, not when its load starts: models used
  during a slow load stay, and only the least recently used idle one goes. So up to
  capacity + loads in flight are resident for the length of a load (evicting first cost a
  third of the hits on a Zipf trace: bench/results/experiment_cache.txt);
- a failed load is not cached, and every waiter gets the error.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter, OrderedDict
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator

from modelplex.errors import ModelLoadError, ModelplexError

log = logging.getLogger("modelplex.cache")

Loader = Callable[[str], Awaitable[Any]]
Listener = Callable[[str, str, float], None]


class ModelInUse(ModelplexError):
    status = 409
    code = "model_in_use"


class ModelCache:
    """Up to ``capacity`` models, loaded on demand by ``load`` and evicted least recently used."""

    def __init__(
        self,
        load: Loader,
        capacity: int,
        *,
        listener: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 (got {capacity})")
        self.capacity = capacity
        self._load = load
        self._listener = listener
        self._clock = clock
        self._models: OrderedDict[str, Any] = OrderedDict()  # least recently used first
        self._loading: dict[str, asyncio.Future] = {}
        self._pins: Counter[str] = Counter()
        self._idle = asyncio.Condition()
        self._background: set[asyncio.Task] = set()
        self.version = 0

    # -- what the replica reports ------------------------------------------------------------

    @property
    def loaded(self) -> list[str]:
        """Loaded model ids, least recently used first."""
        return list(self._models)

    @property
    def loading(self) -> list[str]:
        return list(self._loading)

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._models

    # -- use -----------------------------------------------------------------------------------

    async def get(self, model_id: str) -> Any:
        """The model, loading it if needed; concurrent calls for one id share one load."""
        if model_id in self._models:
            self._models.move_to_end(model_id)
            return self._models[model_id]
        future = self._loading.get(model_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._loading[model_id] = future
            # The load runs in its own task: a caller that goes away does not cancel it for the others.
            self._spawn(self._load_into(model_id, future))
            self._notify("loading", model_id, 0.0)
        return await asyncio.shield(future)

    @contextmanager
    def pinned(self, model_id: str) -> Iterator[None]:
        """Mark ``model_id`` in use for the duration of a request: it is not evicted meanwhile."""
        self._pins[model_id] += 1
        try:
            yield
        finally:
            self._pins[model_id] -= 1
            if self._pins[model_id] <= 0:
                del self._pins[model_id]
                self._spawn(self._on_idle())

    async def evict(self, model_id: str, *, timeout: float = 30.0) -> bool:
        """Unload ``model_id`` once no request uses it; False if it was not loaded."""
        if model_id not in self._models:
            return False
        try:
            async with self._idle:
                await asyncio.wait_for(self._idle.wait_for(lambda: self._pins[model_id] == 0), timeout)
        except TimeoutError:
            raise ModelInUse(f"model {model_id!r} is still serving requests after {timeout:g} s") from None
        if model_id not in self._models:
            return False
        await self._unload(model_id)
        return True

    async def close(self) -> None:
        """Unload everything (replica shutdown) and stop background work."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for model_id in list(self._models):
            await self._unload(model_id)

    # -- internals -----------------------------------------------------------------------------

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _load_into(self, model_id: str, future: asyncio.Future) -> None:
        log.info("Loading model %r.", model_id)
        started = self._clock()
        try:
            model = await self._load(model_id)
        except BaseException as error:  # noqa: BLE001 - every waiter must hear about it
            seconds = self._clock() - started
            del self._loading[model_id]
            log.warning("Loading model %r failed after %.3f s: %s", model_id, seconds, error)
            if isinstance(error, ModelplexError):
                future.set_exception(error)
            else:
                future.set_exception(ModelLoadError(f"loading model {model_id!r} failed: {error!r}"))
            future.exception()  # mark retrieved: there may be no waiter left
            self._notify("load_failed", model_id, seconds)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        seconds = self._clock() - started
        del self._loading[model_id]
        self._models[model_id] = model
        self.version += 1
        log.info("Loaded model %r in %.3f s.", model_id, seconds)
        self._notify("loaded", model_id, seconds)
        await self._make_room(keep=model_id)
        future.set_result(model)

    async def _make_room(self, keep: str | None = None) -> None:
        """Evict idle models, least recently used first, until the loaded ones fit."""
        while len(self._models) > self.capacity:
            victim = next((m for m in self._models if self._pins[m] == 0 and m != keep), None)
            if victim is None:
                return  # every loaded model serves a request: evict when one goes idle
            await self._unload(victim)

    async def _on_idle(self) -> None:
        async with self._idle:
            self._idle.notify_all()
        await self._make_room()

    async def _unload(self, model_id: str) -> None:
        model = self._models.pop(model_id)
        self.version += 1
        log.info("Unloading model %r.", model_id)
        started = self._clock()
        try:
            await _release(model)
        except Exception:  # noqa: BLE001 - a broken unload() must not wedge the cache
            log.exception("unload() of model %r raised", model_id)
        del model  # the last reference: CPython runs __del__ now
        seconds = self._clock() - started
        log.info("Unloaded model %r in %.3f s.", model_id, seconds)
        self._notify("evicted", model_id, seconds)

    def _notify(self, event: str, model_id: str, seconds: float) -> None:
        if self._listener is not None:
            try:
                self._listener(event, model_id, seconds)
            except Exception:  # noqa: BLE001
                log.exception("cache listener failed on %s %r", event, model_id)


async def _release(model: Any) -> None:
    """Call the model's ``unload()`` (sync or async) if it has one."""
    unload = getattr(model, "unload", None)
    if callable(unload):
        result = unload()
        if inspect.isawaitable(result):
            await result
