"""Experiments on Modelplex without changing its code (``run.py --mpx-experiment``,
``profile_modelplex.py --uvloop``): this folder goes first on the replicas' and the router's
PYTHONPATH only then, and Python imports this module at start-up.

- ``BENCH_UVLOOP=1``: the asyncio event loop policy is uvloop's.
- ``BENCH_CACHE_POLICY=lfu``: the replica's model cache evicts the idle model with the
  fewest requests so far (counts kept across evictions; ties: least recently used) instead
  of the least recently used one.
- ``BENCH_CACHE_POLICY=evict-after-load``: LRU, but a load in flight does not take a slot
  (the victim is chosen when the new model is in, so concurrent loads of cold models do not
  push hot ones out first; a replica holds up to capacity + loads in flight meanwhile).
- ``BENCH_CACHE_POLICY=lfu-after-load``: both.
- ``BENCH_CACHE_POLICY=lru-bounded`` / ``lfu-bounded``: at most ``BENCH_MAX_LOADS`` (default
  capacity // 2) loads run at
  once per replica (the others wait their turn), each taking a slot while it runs, so a replica
  never holds more than its capacity (memory-safe, as Ray's one-load-at-a-time is) and the
  loads in flight can push out at most half the loaded models.
- ``BENCH_CACHE_POLICY=lfu-after-load-bounded``: LFU victims chosen after the load, and at most
  ``BENCH_MAX_LOADS`` loads at once: a replica holds at most capacity + that many models.
"""

import os

if os.environ.get("BENCH_UVLOOP") == "1":
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

_POLICY = os.environ.get("BENCH_CACHE_POLICY", "")
if _POLICY:
    from collections import Counter

    from modelplex import cache as _cache

    import asyncio

    _lfu = _POLICY.startswith("lfu")
    _after_load = "after-load" in _POLICY
    _bounded = _POLICY.endswith("bounded")
    _original_get = _cache.ModelCache.get
    _original_load_into = _cache.ModelCache._load_into

    def _loads_counted(self):
        if _after_load:
            return 0
        if _bounded:  # loads holding a turn whose model is not in yet
            return sum(1 for m in self.__dict__.get("_bench_active", ()) if m not in self._models)
        return len(self._loading)

    async def _load_into(self, model_id, future):
        semaphore = self.__dict__.get("_bench_semaphore")
        if semaphore is None:
            semaphore = self.__dict__["_bench_semaphore"] = asyncio.Semaphore(
                int(os.environ.get("BENCH_MAX_LOADS", 0)) or max(1, self.capacity // 2))
        async with semaphore:
            active = self.__dict__.setdefault("_bench_active", set())
            active.add(model_id)
            try:
                await _original_load_into(self, model_id, future)
            finally:
                active.discard(model_id)

    async def get(self, model_id):
        self.__dict__.setdefault("_bench_requests", Counter())[model_id] += 1
        return await _original_get(self, model_id)

    async def _make_room(self, keep=None):
        requests = self.__dict__.setdefault("_bench_requests", Counter())
        while len(self._models) + _loads_counted(self) > self.capacity:
            idle = [m for m in self._models if self._pins[m] == 0 and m != keep]  # least recently used first
            if not idle:
                return
            victim = min(idle, key=lambda m: requests[m]) if _lfu else idle[0]
            await self._unload(victim)

    _cache.ModelCache.get = get
    _cache.ModelCache._make_room = _make_room
    if _bounded:
        _cache.ModelCache._load_into = _load_into
