"""The multiplexed model cache: LRU order, single flight, parallel loads, safe eviction."""

import asyncio
import gc

import pytest

from modelplex.cache import ModelCache, ModelInUse
from modelplex.errors import ModelLoadError, ModelNotFound


class Model:
    def __init__(self, model_id, log):
        self.model_id = model_id
        self.log = log

    def __del__(self):
        self.log.append(("del", self.model_id))


class Store:
    """A loader that records what it loaded and can be held open by the test."""

    def __init__(self):
        self.loads: list[str] = []
        self.events: list[tuple] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}
        self.fail: set[str] = set()

    def gate(self, model_id):
        self.gates[model_id] = asyncio.Event()
        self.started[model_id] = asyncio.Event()
        return self.gates[model_id]

    async def load(self, model_id):
        self.loads.append(model_id)
        if model_id in self.started:
            self.started[model_id].set()
        if model_id in self.gates:
            await self.gates[model_id].wait()
        if model_id in self.fail:
            raise RuntimeError(f"weights for {model_id} are corrupt")
        return Model(model_id, self.events)

    def listener(self, event, model_id, seconds):
        self.events.append((event, model_id))


def make_cache(store, capacity=2):
    return ModelCache(store.load, capacity, listener=store.listener)


async def test_least_recently_used_model_is_evicted():
    store = Store()
    cache = make_cache(store, capacity=2)
    await cache.get("a")
    await cache.get("b")
    await cache.get("a")  # a is now the most recently used
    await cache.get("c")
    assert cache.loaded == ["a", "c"]
    assert ("evicted", "b") in store.events


async def test_cache_hit_does_not_reload():
    store = Store()
    cache = make_cache(store)
    first = await cache.get("a")
    second = await cache.get("a")
    assert first is second
    assert store.loads == ["a"]


async def test_concurrent_requests_for_one_model_load_it_once():
    store = Store()
    gate = store.gate("a")
    cache = make_cache(store)
    waiters = [asyncio.create_task(cache.get("a")) for _ in range(10)]
    await store.started["a"].wait()
    gate.set()
    models = await asyncio.gather(*waiters)
    assert store.loads == ["a"]
    assert all(model is models[0] for model in models)


async def test_loads_of_different_models_run_in_parallel():
    store = Store()
    gate_a, gate_b = store.gate("a"), store.gate("b")
    cache = make_cache(store)
    task_a = asyncio.create_task(cache.get("a"))
    task_b = asyncio.create_task(cache.get("b"))
    # Both loads are under way at once: b started while a is still held open.
    await asyncio.wait_for(store.started["a"].wait(), 5)
    await asyncio.wait_for(store.started["b"].wait(), 5)
    assert sorted(cache.loading) == ["a", "b"]
    gate_a.set()
    gate_b.set()
    await asyncio.gather(task_a, task_b)
    assert sorted(cache.loaded) == ["a", "b"]


async def test_a_model_used_while_another_loads_is_not_the_one_evicted():
    store = Store()
    cache = make_cache(store, capacity=2)
    await cache.get("a")
    await cache.get("b")  # a is least recently used now
    gate = store.gate("c")
    loading = asyncio.create_task(cache.get("c"))
    await store.started["c"].wait()
    await cache.get("a")  # used during c's load: b is the least recently used when c is in
    gate.set()
    await loading
    assert cache.loaded == ["a", "c"]
    assert ("evicted", "b") in store.events and ("evicted", "a") not in store.events


async def test_model_in_use_is_not_evicted_under_a_request():
    store = Store()
    cache = make_cache(store, capacity=1)
    await cache.get("a")
    with cache.pinned("a"):
        await cache.get("b")  # over capacity: a is busy, so it stays
        assert sorted(cache.loaded) == ["a", "b"]
        assert ("evicted", "a") not in store.events
    # a went idle: the cache shrinks back to capacity, evicting the least recently used.
    for _ in range(50):
        if cache.loaded == ["b"]:
            break
        await asyncio.sleep(0.01)
    assert cache.loaded == ["b"]
    assert ("evicted", "a") in store.events


async def test_eviction_skips_busy_models_and_takes_the_next_idle_one():
    store = Store()
    cache = make_cache(store, capacity=2)
    await cache.get("a")
    await cache.get("b")
    with cache.pinned("a"):  # a is the LRU but serving a request
        await cache.get("c")
        assert sorted(cache.loaded) == ["a", "c"]


async def test_eviction_awaits_unload():
    unloaded = []

    class Unloadable:
        def __init__(self, model_id):
            self.model_id = model_id

        async def unload(self):
            await asyncio.sleep(0)
            unloaded.append(self.model_id)

    async def load(model_id):
        return Unloadable(model_id)

    cache = ModelCache(load, 1)
    await cache.get("a")
    await cache.get("b")
    assert unloaded == ["a"]


async def test_eviction_runs_del_on_the_evicted_model():
    store = Store()
    cache = make_cache(store, capacity=1)
    await cache.get("a")
    await cache.get("b")
    gc.collect()
    assert ("del", "a") in store.events
    assert ("del", "b") not in store.events


async def test_failed_load_is_not_cached_and_every_waiter_gets_the_error():
    store = Store()
    store.fail.add("a")
    gate = store.gate("a")
    cache = make_cache(store)
    waiters = [asyncio.create_task(cache.get("a")) for _ in range(3)]
    await store.started["a"].wait()
    gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(result, ModelLoadError) for result in results)
    assert "corrupt" in str(results[0])
    assert cache.loaded == [] and cache.loading == []
    assert ("load_failed", "a") in store.events
    # Not cached: the next request tries again, and succeeds once the source is fixed.
    store.fail.clear()
    await cache.get("a")
    assert store.loads == ["a", "a"]
    assert cache.loaded == ["a"]


async def test_not_found_keeps_its_error_type():
    async def load(model_id):
        raise ModelNotFound(f"no {model_id}")

    cache = ModelCache(load, 2)
    with pytest.raises(ModelNotFound):
        await cache.get("x")


async def test_caller_that_goes_away_does_not_cancel_the_load_for_others():
    store = Store()
    gate = store.gate("a")
    cache = make_cache(store)
    impatient = asyncio.create_task(cache.get("a"))
    patient = asyncio.create_task(cache.get("a"))
    await store.started["a"].wait()
    impatient.cancel()
    gate.set()
    model = await patient
    assert model.model_id == "a"
    assert cache.loaded == ["a"]


async def test_explicit_evict_waits_for_requests_in_flight():
    store = Store()
    cache = make_cache(store)
    await cache.get("a")
    with cache.pinned("a"):
        evicting = asyncio.create_task(cache.evict("a"))
        await asyncio.sleep(0.05)
        assert not evicting.done()
        assert cache.loaded == ["a"]
    assert await asyncio.wait_for(evicting, 5) is True
    assert cache.loaded == []


async def test_explicit_evict_gives_up_on_a_model_that_stays_busy():
    store = Store()
    cache = make_cache(store)
    await cache.get("a")
    with cache.pinned("a"):
        with pytest.raises(ModelInUse):
            await cache.evict("a", timeout=0.05)
    assert await cache.evict("missing") is False


async def test_version_grows_with_every_load_and_eviction():
    store = Store()
    cache = make_cache(store, capacity=1)
    versions = [cache.version]
    await cache.get("a")
    versions.append(cache.version)
    await cache.get("b")  # evicts a, loads b
    versions.append(cache.version)
    assert versions == sorted(set(versions))
    assert versions[-1] == 3
