"""Ray Serve's ``@serve.multiplexed`` behaviour, rewritten for ``modelplex.multiplexed``.

Follows ``python/ray/serve/tests/test_multiplex.py`` in ray-project/ray: decorator checks,
``get_multiplexed_model_id``, the LRU wrapper and bad calls. Ray's checks of its controller's
private routing state are covered by our router's own tests instead.
"""

import asyncio
import gc

import pytest

from modelplex import get_multiplexed_model_id, multiplexed
from modelplex.context import reset_multiplexed_model_id, set_multiplexed_model_id
from modelplex.multiplex import find_cache

pytestmark = pytest.mark.looptime


def test_decorator_accepts_ray_forms_and_refuses_bad_ones():
    @multiplexed
    async def get_model(model: str):
        return model

    @multiplexed(max_num_models_per_replica=1)
    async def get_model2(model: str):
        return model

    class MyModel:
        @multiplexed
        async def get_model(model: str):  # no self: accepted, as in Ray
            return model

    class MyModel2:
        @multiplexed(max_num_models_per_replica=1)
        async def get_model(self, model: str):
            return model

    with pytest.raises(TypeError):

        @multiplexed
        class BadDecorator:
            pass

    with pytest.raises(TypeError):
        multiplexed(max_num_models_per_replica="1")
    with pytest.raises(ValueError):
        multiplexed(max_num_models_per_replica=0)
    with pytest.raises(TypeError):

        @multiplexed
        def get_model5(model: str):
            return model

    with pytest.raises(TypeError):

        class MyModel3:
            @multiplexed
            def get_model(self, model: str):
                return model

    with pytest.raises(TypeError):

        @multiplexed
        async def get_model6():
            return None

    with pytest.raises(TypeError):

        class MyModel4:
            @multiplexed
            async def get_model(self):
                return None


def test_get_multiplexed_model_id_reads_the_request_context():
    assert get_multiplexed_model_id() == ""
    token = set_multiplexed_model_id("1")
    try:
        assert get_multiplexed_model_id() == "1"
    finally:
        reset_multiplexed_model_id(token)


class Model:
    def __init__(self, model_id):
        self.model_id = model_id


def loader_with(capacity, gate=None):
    class Loader:
        @multiplexed(max_num_models_per_replica=capacity)
        async def load(self, model_id: str):
            if gate is not None:
                await gate.wait()
            return Model(model_id)

    return Loader()


async def test_the_wrapper_keeps_the_most_recently_used_models():
    loader = loader_with(2)
    for model_id in ("1", "2", "3"):  # 3 pushes 1 out
        await loader.load(model_id)
    cache = find_cache(loader)
    assert cache.loaded == ["2", "3"]
    await loader.load("2")  # 2 becomes the most recently used
    assert cache.loaded == ["3", "2"]
    await loader.load("4")  # 3 goes
    assert cache.loaded == ["2", "4"]


async def test_a_bad_call_is_a_type_error():
    loader = loader_with(2)
    with pytest.raises(TypeError):
        await loader.load(1)
    with pytest.raises(TypeError):
        await loader.load()


def server_of(model_class):
    """A deployment-like class whose @multiplexed loader (one model at a time) builds ``model_class(model_id)``."""

    class Server:
        @multiplexed(max_num_models_per_replica=1)
        async def get_model(self, model_id):
            return model_class(model_id)

    return Server()


async def test_an_unload_that_raises_does_not_break_the_next_load():
    class Fragile:
        def __init__(self, model_id):
            self.model_id = model_id

        def unload(self):
            raise RuntimeError(f"{self.model_id} is dead")

    server = server_of(Fragile)
    await server.get_model("1")
    # Ray raises the model's __del__ error into the caller; we log it and serve the new model.
    assert (await server.get_model("2")).model_id == "2"
    assert find_cache(server).loaded == ["2"]


async def test_an_async_del_is_awaited_on_eviction(recwarn):
    """Issue 31, item 9 (Ray's unload_model awaits an ``async def __del__``): it used to be left
    to the interpreter, which only creates the coroutine ("was never awaited")."""
    finished = []

    class MyModel:
        def __init__(self, model_id):
            self.model_id = model_id

        async def __del__(self):
            await asyncio.sleep(0.5)  # an awaited finaliser: it closes connections, frees memory
            finished.append(self.model_id)

    server = server_of(MyModel)
    await server.get_model("1")
    assert (await server.get_model("2")).model_id == "2"
    assert finished == ["1"]  # awaited before the new model was kept
    await find_cache(server).close()  # a replica's shutdown evicts the rest
    assert finished == ["1", "2"]
    del server
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_a_plain_del_runs_once_on_eviction_and_its_error_is_logged(caplog):
    """Ray's test_unload_model_call_del: the evicted model's ``def __del__`` runs at the unload,
    even while a reference to the model outlives it. Ray raises its error into the request whose
    load caused the eviction; we log it, naming the model, and serve the new model (README)."""
    calls = []

    class MyModel:
        def __init__(self, model_id):
            self.model_id = model_id

        def __del__(self):
            calls.append(self.model_id)
            raise Exception(f"{self.model_id} is dead")

    server = server_of(MyModel)  # Ray's @serve.multiplexed(max_num_models_per_replica=1) get_model
    model1 = await server.get_model("model1")
    assert model1.model_id == "model1"
    with caplog.at_level("ERROR", logger="modelplex.cache"):
        assert (await server.get_model("model2")).model_id == "model2"
    assert calls == ["model1"]
    assert "unloading model 'model1' raised" in caplog.text and "model1 is dead" in caplog.text
    del model1
    gc.collect()
    assert calls == ["model1"]  # once: the interpreter's own call finds it done
    await find_cache(server).close()  # a replica's shutdown evicts the rest
    assert calls == ["model1", "model2"]


async def test_loads_of_different_models_run_concurrently_and_the_cache_keeps_its_bound():
    gate = asyncio.Event()
    loader = loader_with(1, gate)
    tasks = [asyncio.create_task(loader.load(model_id)) for model_id in ("1", "2", "3")]
    await asyncio.sleep(1)
    models = find_cache(loader)
    assert models.loaded == [] and sorted(models.loading) == ["1", "2", "3"]
    gate.set()
    done, _ = await asyncio.wait(tasks, timeout=1)
    assert len(done) == 3
    assert len(models.loaded) == 1 and models.loading == []

