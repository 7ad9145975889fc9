"""The multiplexed model cache: LRU order, single flight, parallel loads, safe eviction."""

import asyncio
import gc

import pytest

from modelplex.cache import FAILURE_VERSION_INTERVAL_S, ModelCache, ModelInUse
from modelplex.wire.errors import ModelLoadError, ModelNotFound

# On looptime's virtual clock: waits and timeouts cost no real time.
pytestmark = pytest.mark.looptime


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


async def test_failures_are_remembered_per_id_counted_dated_and_bounded():
    from modelplex.wire.loaded import MAX_FAILURES

    store = Store()
    clock = Clock()
    cache = ModelCache(store.load, 2, listener=store.listener, clock=clock, wall_clock=lambda: 1_767_225_600.0)
    store.fail.update({"a", "b"})
    for model_id in ("a", "b", "a"):
        version = cache.version
        with pytest.raises(ModelLoadError):
            await cache.get(model_id)
        assert cache.version == version + 1  # the document changed: its readers fetch it again
        clock.now += FAILURE_VERSION_INTERVAL_S
    assert [(f.model, f.count, f.at) for f in cache.failures] == [
        ("b", 1, "2026-01-01T00:00:00Z"), ("a", 2, "2026-01-01T00:00:00Z")]  # the latest last
    assert "weights for a are corrupt" in cache.failures[-1].error
    for i in range(MAX_FAILURES + 5):
        store.fail.add(f"m{i}")
        with pytest.raises(ModelLoadError):
            await cache.get(f"m{i}")
    assert len(cache.failures) == MAX_FAILURES and cache.failures[-1].model == f"m{MAX_FAILURES + 4}"


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


# -- the byte budget, bounded loads, timeouts, the warm tier, lfu ------------------------------

MB = 1_000_000


class Sized(Store):
    """A store whose models have fake sizes, checking the budget at every load start."""

    def __init__(self, sizes, budget=None):
        super().__init__()
        self.sizes = sizes
        self.budget = budget
        self.cache: ModelCache | None = None
        self.peak = 0  # the most bytes loaded + reserved at any load start or end
        self.running = 0
        self.most_running = 0

    def size_of(self, model_id, model):
        return self.sizes[model_id]

    async def load(self, model_id):
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        self.peak = max(self.peak, self.cache.bytes_used)
        try:
            return await super().load(model_id)
        finally:
            self.running -= 1

    def listener(self, event, model_id, seconds):
        super().listener(event, model_id, seconds)
        self.peak = max(self.peak, self.cache.bytes_used)


def sized_cache(store, *, capacity=100, **options):
    store.cache = ModelCache(store.load, capacity, size_of=store.size_of, listener=store.listener, **options)
    return store.cache


async def test_concurrent_loads_never_reserve_more_than_the_byte_budget():
    sizes = {f"m{i}": (20 + 7 * (i % 5)) * MB for i in range(40)}
    store = Sized(sizes)
    cache = sized_cache(store, max_bytes=100 * MB)
    for model_id in sizes:  # every size measured once: from now on each load reserves its own
        await cache.get(model_id)
    assert cache.bytes_used <= 100 * MB
    store.peak = 0
    for model_id in sizes:
        store.gate(model_id)
    waiters = [asyncio.create_task(cache.get(model_id)) for model_id in reversed(sizes)]
    for _ in range(200):  # let loads start and reserve, then release them a few at a time
        await asyncio.sleep(0)
        assert cache.bytes_used <= 100 * MB
        for model_id in [m for m in cache.loading if store.started[m].is_set()][:2]:
            store.gates[model_id].set()
    for gate in store.gates.values():
        gate.set()
    await asyncio.gather(*waiters)
    assert 0 < store.peak <= 100 * MB
    assert sum(cache.model_bytes.values()) == cache.bytes_used <= 100 * MB
    assert cache.model_bytes == {m: sizes[m] for m in cache.loaded}


async def test_a_load_waits_for_room_while_every_model_serves_a_request():
    store = Sized({"a": 60 * MB, "b": 60 * MB})
    cache = sized_cache(store, max_bytes=100 * MB)
    await cache.get("b")
    await cache.evict("b")  # b's size is known now
    await cache.get("a")
    with cache.pinned("a"):
        loading = asyncio.create_task(cache.get("b"))
        await asyncio.sleep(0.01)
        assert not loading.done() and store.loads == ["b", "a"]  # b's 60 MB do not fit beside a's
    await asyncio.wait_for(loading, 5)  # a went idle: it is evicted and b loads
    assert cache.loaded == ["b"] and store.loads == ["b", "a", "b"]


async def test_an_unmeasured_id_reserves_the_mean_measured_size():
    store = Sized({"a": 30 * MB, "b": 50 * MB, "c": 40 * MB})
    cache = sized_cache(store, max_bytes=1000 * MB)
    await cache.get("a")
    await cache.get("b")
    gate = store.gate("c")
    loading = asyncio.create_task(cache.get("c"))
    await store.started["c"].wait()
    assert cache.bytes_reserved == 40 * MB  # (30 + 50) / 2
    gate.set()
    await loading
    assert cache.bytes_reserved == 0 and cache.bytes_used == 120 * MB


async def test_a_declared_size_grows_the_reservation_and_evicts_first():
    from modelplex.cache import current_load

    store = Sized({"a": 50 * MB, "b": 70 * MB})
    cache = sized_cache(store, max_bytes=100 * MB)
    seen = []

    async def load(model_id):
        context = current_load()
        await context.expect(store.sizes[model_id])  # e.g. its file's size
        seen.append((model_id, cache.bytes_reserved, cache.loaded))
        return Model(model_id, store.events)

    cache._load = load
    await cache.get("a")
    await cache.get("b")
    # b declared 70 MB: a (idle) was evicted before b's weights came in.
    assert seen == [("a", 50 * MB, []), ("b", 70 * MB, [])]
    assert cache.loaded == ["b"]


async def test_a_model_larger_than_the_whole_budget_is_refused_and_not_loaded_again():
    from modelplex.wire.errors import ModelTooLarge

    store = Sized({"huge": 300 * MB})
    cache = sized_cache(store, max_bytes=100 * MB)
    with pytest.raises(ModelTooLarge, match=r"'huge'.*286\.1 MiB.*95\.4 MiB.*maxModelBytes"):
        await cache.get("huge")
    with pytest.raises(ModelTooLarge):
        await cache.get("huge")
    assert store.loads == ["huge"]  # the second request was refused without a load
    assert cache.loaded == [] and cache.bytes_used == 0


async def test_at_most_max_concurrent_loads_run_and_queued_loads_start_in_order():
    order = []

    async def load(model_id):
        order.append(model_id)
        await asyncio.sleep(1)
        return model_id

    cache = ModelCache(load, 100, max_concurrent_loads=2)
    running = []

    async def watch():
        while True:
            running.append(cache.loads_running)
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    ids = [f"m{i}" for i in range(7)]
    tasks = []
    for model_id in ids:
        tasks.append(asyncio.create_task(cache.get(model_id)))
        await asyncio.sleep(0)  # asked for in this order
    assert await asyncio.gather(*tasks) == ids
    watcher.cancel()
    assert order == ids
    assert max(running) == 2
    assert asyncio.get_running_loop().time() == pytest.approx(4, abs=0.01)  # 7 loads of 1 s, 2 at a time


async def test_no_more_loads_run_at_once_than_models_fit():
    async def load(model_id):
        await asyncio.sleep(1)
        return model_id

    cache = ModelCache(load, 2, max_concurrent_loads=3)
    tasks = [asyncio.create_task(cache.get(model_id)) for model_id in ("a", "b", "c")]
    await asyncio.sleep(0.5)
    assert cache.loads_running == 2 and cache.loads_queued == 1
    assert await asyncio.gather(*tasks) == ["a", "b", "c"]
    assert asyncio.get_running_loop().time() == pytest.approx(2, abs=0.01)


async def test_a_queued_load_whose_callers_all_left_is_dropped():
    store = Store()
    store.gate("busy")
    cache = ModelCache(store.load, 10, max_concurrent_loads=1, listener=store.listener)
    busy = asyncio.create_task(cache.get("busy"))
    await store.started["busy"].wait()
    impatient = [asyncio.create_task(cache.get("queued")) for _ in range(3)]
    await asyncio.sleep(0)
    assert cache.loads_queued == 1 and cache.loading == ["busy", "queued"]
    for task in impatient:
        task.cancel()
    await asyncio.gather(*impatient, return_exceptions=True)
    assert cache.loading == ["busy"]
    assert ("load_dropped", "queued") in store.events
    store.gates["busy"].set()
    await busy
    await asyncio.sleep(1)
    assert store.loads == ["busy"]  # the dropped load never ran
    assert await cache.get("queued") is not None  # and a new request loads it
    assert store.loads == ["busy", "queued"]


async def test_a_load_past_its_timeout_answers_504_to_every_waiter_and_is_not_cached():
    from modelplex.wire.errors import ModelLoadTimeout

    store = Store()
    store.gate("slow")
    cache = ModelCache(store.load, 10, load_timeout_s=30, max_concurrent_loads=1, listener=store.listener)
    waiters = [asyncio.create_task(cache.get("slow")) for _ in range(3)]
    queued = asyncio.create_task(cache.get("next"))
    await asyncio.sleep(29.9)
    assert not any(w.done() for w in waiters)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert asyncio.get_running_loop().time() == pytest.approx(30, abs=0.01)
    assert all(isinstance(r, ModelLoadTimeout) and r.status == 504 for r in results)
    assert "'slow'" in str(results[0]) and "loadTimeoutSeconds (30 s)" in str(results[0])
    assert "slow" not in cache.loaded and ("load_failed", "slow") in store.events
    # Its slot went to the queued load, whose time limit counts from its own start.
    assert (await queued).model_id == "next"
    # The next request retries, and succeeds once the source answers.
    store.gates["slow"].set()
    assert (await cache.get("slow")).model_id == "slow"
    assert store.loads == ["slow", "next", "slow"]


async def test_the_loaders_own_timeout_error_is_a_load_failure_not_a_504():
    async def load(model_id):
        raise TimeoutError("the object store did not answer")

    cache = ModelCache(load, 10, load_timeout_s=30)
    with pytest.raises(ModelLoadError, match="did not answer"):
        await cache.get("a")


class DictTier:
    """A warm tier in a dict, as the cache sees one."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.models = {}
        self.taken = []

    def holds(self, model_id):
        return model_id in self.models

    async def keep(self, model_id, model, nbytes):
        if nbytes > self.capacity:
            return False
        self.models[model_id] = model
        return True

    async def take(self, model_id):
        self.taken.append(model_id)
        return self.models.pop(model_id, None)

    async def close(self):
        self.models.clear()


async def test_an_evicted_model_goes_to_the_warm_tier_and_comes_back_without_a_load():
    store = Sized({"a": 60 * MB, "b": 60 * MB, "big": 500 * MB})
    warm = DictTier(capacity=200 * MB)
    cache = sized_cache(store, max_bytes=1000 * MB, capacity=1, warm=warm)
    first_a = await cache.get("a")
    await cache.get("b")  # evicts a: to the warm tier
    assert warm.holds("a") and ("evicted", "a") in store.events
    assert await cache.get("a") is first_a  # a copy back, not a load
    assert store.loads == ["a", "b"] and warm.taken == ["a"]
    assert ("loaded_warm", "a") in store.events and warm.holds("b")
    await cache.get("big")  # a's 60 MB fit the tier; big's would not
    await cache.get("a")
    assert not warm.holds("big")
    assert store.loads == ["a", "b", "big"]


async def test_waiters_for_a_warm_model_are_never_turned_away_and_need_no_load_slot():
    store = Sized({"a": 10 * MB, "b": 10 * MB, "c": 10 * MB})
    warm = DictTier(capacity=100 * MB)
    cache = sized_cache(store, capacity=1, warm=warm, max_concurrent_loads=1, max_waiting=2)
    await cache.get("a")
    await cache.get("b")  # a is warm
    store.gate("c")
    blocking = asyncio.create_task(cache.get("c"))  # holds the only load slot
    await store.started["c"].wait()
    results = await asyncio.gather(*(cache.get("a") for _ in range(5)))
    assert all(r.model_id == "a" for r in results)
    store.gates["c"].set()
    await blocking


async def test_requests_waiting_for_one_load_are_bounded():
    from modelplex.wire.errors import Overloaded

    store = Store()
    store.gate("a")
    cache = ModelCache(store.load, 10, max_waiting=2)
    waiting = [asyncio.create_task(cache.get("a")) for _ in range(2)]
    await store.started["a"].wait()
    with pytest.raises(Overloaded, match="2 requests already wait for model 'a'"):
        await cache.get("a")
    store.gates["a"].set()
    await asyncio.gather(*waiting)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


async def test_lfu_evicts_the_least_requested_model():
    store = Store()
    cache = ModelCache(store.load, 2, policy="lfu", listener=store.listener, clock=Clock())
    for model_id in ["a", "a", "a", "b", "a"]:
        await cache.get(model_id)
    await cache.get("b")  # b is the most recently used, but a is asked for more
    await cache.get("c")
    assert sorted(cache.loaded) == ["a", "c"]


async def _lfu_cache_with_a_once_hot_model() -> tuple[Clock, Store, ModelCache]:
    """Two slots under LFU; ``once-hot`` asked for 16 times."""
    clock = Clock()
    store = Store()
    cache = ModelCache(store.load, 2, policy="lfu", listener=store.listener, clock=clock)
    for _ in range(16):
        await cache.get("once-hot")
    return clock, store, cache


async def test_lfu_ages_counts_so_a_once_hot_model_goes():
    from modelplex.cache import LFU_HALF_LIFE_S

    clock, store, cache = await _lfu_cache_with_a_once_hot_model()
    clock.now += 5 * LFU_HALF_LIFE_S  # 16 requests are worth 0.5 now
    await cache.get("b")
    await cache.get("c")  # b (1 request) outweighs once-hot (16 halved five times)
    assert sorted(cache.loaded) == ["b", "c"]
    assert ("evicted", "once-hot") in store.events


async def test_lfu_without_ageing_would_keep_the_once_hot_model():
    clock, store, cache = await _lfu_cache_with_a_once_hot_model()
    clock.now += 1.0  # little time: the counts hold
    await cache.get("b")
    await cache.get("c")
    assert sorted(cache.loaded) == ["c", "once-hot"]


def test_the_cache_refuses_nonsense_limits():
    async def load(model_id):
        return model_id

    for options, message in [({"max_bytes": 0}, "max_bytes"), ({"max_concurrent_loads": 0}, "max_concurrent_loads"),
                             ({"load_timeout_s": 0}, "load_timeout_s"), ({"policy": "fifo"}, "policy")]:
        with pytest.raises(ValueError, match=message):
            ModelCache(load, 1, **options)


async def test_loads_that_both_outgrow_their_reservations_do_not_wait_for_each_other():
    from modelplex.cache import current_load

    store = Sized({"x": 50 * MB, "a": 80 * MB, "b": 80 * MB})
    cache = sized_cache(store, max_bytes=100 * MB)
    await cache.get("x")
    await cache.evict("x")  # the mean measured size is 50 MB now
    both_reserved = asyncio.Event()

    async def load(model_id):
        if cache.bytes_reserved == 100 * MB:
            both_reserved.set()
        await both_reserved.wait()  # a and b each hold 50 MB, then declare 80
        await current_load().expect(80 * MB)
        assert cache.bytes_used <= 100 * MB
        return Model(model_id, store.events)

    cache._load = load
    a, b = asyncio.create_task(cache.get("a")), asyncio.create_task(cache.get("b"))
    await asyncio.wait_for(asyncio.gather(a, b), 10)
    assert cache.loaded == ["b"] or cache.loaded == ["a"]  # one evicted the other once idle


# -- ids that do not exist: no eviction, no refetch, few version moves --------------------------


def missing(fetched: list | None = None, where: str = ""):
    """A loader whose source has no model at all (recording the ids it was asked for)."""
    async def load(model_id):
        if fetched is not None:
            fetched.append(model_id)
        raise ModelNotFound(f"model {model_id!r} not found{where}")

    return load


async def test_a_model_the_source_does_not_have_evicts_nothing():
    store = Sized({"a": 50 * MB, "b": 50 * MB})
    cache = sized_cache(store, max_bytes=100 * MB)
    await cache.get("a")
    await cache.get("b")  # full: one more model of the mean size would need an eviction
    load = store.load

    async def load_or_404(model_id):
        if model_id.startswith("ghost"):
            raise ModelNotFound(f"model {model_id!r} not found")
        return await load(model_id)

    cache._load = load_or_404
    for i in range(20):
        with pytest.raises(ModelNotFound):
            await cache.get(f"ghost-{i}")
    assert cache.loaded == ["a", "b"]
    assert not [e for e in store.events if e[0] == "evicted"]
    assert cache.bytes_reserved == 0


async def test_a_missing_id_is_answered_from_memory_until_its_ttl_passes():
    clock = Clock()
    fetched = []
    cache = ModelCache(missing(fetched), 2, not_found_ttl_s=3.0, clock=clock)
    for _ in range(5):
        with pytest.raises(ModelNotFound, match="'ghost' not found"):
            await cache.get("ghost")
    assert fetched == ["ghost"]
    clock.now += 3.0
    with pytest.raises(ModelNotFound):
        await cache.get("ghost")
    assert fetched == ["ghost", "ghost"]


async def test_other_load_failures_are_not_remembered_as_missing():
    store = Store()
    store.fail.add("flaky")
    cache = ModelCache(store.load, 2, clock=Clock())
    for _ in range(2):
        with pytest.raises(ModelLoadError):
            await cache.get("flaky")
    assert store.loads == ["flaky", "flaky"]  # a broken file may be fixed: tried again at once


async def test_two_hundred_missing_ids_move_the_version_by_at_most_twenty():
    clock = Clock()
    cache = ModelCache(missing(), 2, clock=clock)
    for i in range(200):
        with pytest.raises(ModelNotFound):
            await cache.get(f"ghost-{i % 50}")  # distinct ids and repeats
        clock.now += 0.25  # 50 s in all
    assert 1 <= cache.version <= 20
    await cache.close()


async def test_a_failure_held_back_shows_when_its_interval_ends():
    clock = Clock()
    events = []
    cache = ModelCache(missing(), 2, clock=clock, listener=lambda event, model_id, s: events.append(event))
    with pytest.raises(ModelNotFound):
        await cache.get("a")
    with pytest.raises(ModelNotFound):
        await cache.get("b")  # within the interval: held back
    assert cache.version == 1 and [f.model for f in cache.failures] == ["a", "b"]
    clock.now += FAILURE_VERSION_INTERVAL_S
    await asyncio.sleep(FAILURE_VERSION_INTERVAL_S + 1)
    assert cache.version == 2 and "failures_shown" in events
    await cache.close()


async def test_a_failures_message_is_shown_without_the_sources_credentials():
    cache = ModelCache(missing(where=" at https://u:pa55@store.example/m.pt?sig=t0k"), 2)
    with pytest.raises(ModelNotFound):
        await cache.get("m")
    (failure,) = cache.failures
    assert "pa55" not in failure.error and "t0k" not in failure.error and "store.example" in failure.error


# -- leases: pinned copies (spec.models minCopies) ---------------------------------------------


async def leased_cache() -> tuple[Clock, Store, ModelCache]:
    """A cache of 2 slots on a fake clock, "pinned" loaded in one of them with a 30 s lease."""
    clock, store = Clock(), Store()
    cache = ModelCache(store.load, 2, listener=store.listener, clock=clock)
    cache.lease(["pinned"], ttl_s=30)
    await cache.get("pinned")
    return clock, store, cache


async def test_a_leased_model_is_never_evicted_while_its_lease_runs():
    _, store, cache = await leased_cache()
    for i in range(20):  # a burst of other ids passes through the one free slot
        await cache.get(f"other-{i}")
    assert "pinned" in cache.loaded
    assert ("evicted", "pinned") not in store.events
    assert cache.loaded == ["pinned", "other-19"]


async def test_a_lease_that_is_not_renewed_runs_out_and_the_model_is_evictable_again():
    clock, store, cache = await leased_cache()
    clock.now += 20
    cache.lease(["pinned"], ttl_s=30)  # renewed: runs until 50
    clock.now += 25
    await cache.get("a")
    await cache.get("b")
    assert "pinned" in cache.loaded and cache.leases == {"pinned": 5.0}
    clock.now += 6  # past 50: no renewal came
    assert cache.leases == {}
    await cache.get("c")
    assert "pinned" not in cache.loaded
    assert ("evicted", "pinned") in store.events


async def test_a_renewal_never_shortens_a_lease():
    clock = Clock()
    cache = ModelCache(Store().load, 2, clock=clock)
    cache.lease(["m"], ttl_s=60)
    cache.lease(["m"], ttl_s=10)  # another router's shorter renewal
    assert cache.leases == {"m": 60.0}
    with pytest.raises(ValueError):
        cache.lease(["m"], ttl_s=0)


async def test_when_leased_models_fill_the_cache_another_load_is_refused_not_a_pin_evicted():
    from modelplex.cache import PinsFillCache

    store = Store()
    cache = ModelCache(store.load, 2, listener=store.listener, clock=Clock())
    cache.lease(["p1", "p2"], ttl_s=30)
    await cache.get("p1")
    await cache.get("p2")
    with pytest.raises(PinsFillCache) as refused:
        await cache.get("other")
    assert refused.value.status == 503 and refused.value.code == "pins_fill_cache"
    assert "minCopies" in refused.value.message
    assert sorted(cache.loaded) == ["p1", "p2"] and "other" not in store.loads


async def test_a_third_pinned_model_beyond_the_capacity_is_refused_too():
    from modelplex.cache import PinsFillCache

    cache = ModelCache(Store().load, 2, clock=Clock())
    cache.lease(["p1", "p2", "p3"], ttl_s=30)
    await cache.get("p1")
    await cache.get("p2")
    with pytest.raises(PinsFillCache):
        await cache.get("p3")


async def test_leased_models_count_against_the_bytes_and_a_load_that_cannot_fit_is_refused():
    from modelplex.cache import PinsFillCache

    store = Sized({"pin": 70 * MB, "a": 20 * MB, "big": 40 * MB})
    cache = sized_cache(store, max_bytes=100 * MB, clock=Clock())
    cache.lease(["pin"], ttl_s=30)
    await cache.get("pin")
    await cache.get("a")
    await cache.get("a")  # measured: 20 MB
    await cache.evict("a")
    await cache.get("big")  # measured once: 40 MB; "pin" stays, so "big" itself goes over
    await cache.evict("big")
    with pytest.raises(PinsFillCache) as refused:
        await cache.get("big")  # 70 pinned + 40 > 100, and nothing else may leave
    assert "model memory" in refused.value.message
    assert cache.loaded == ["pin"]


async def test_an_explicit_unload_of_a_leased_model_is_refused():
    _, _, cache = await leased_cache()
    with pytest.raises(ModelInUse) as refused:
        await cache.evict("pinned")
    assert "pinned here" in refused.value.message
    assert cache.loaded == ["pinned"]
