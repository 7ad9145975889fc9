"""Multiplexing end to end, as Ray's test_multiplex.py checks it: a model's requests stay on
the replica that holds it (over HTTP and through handles) and spread to a second replica when
the first is busy, LRU eviction as the router sees it, a handle's model id that does not leak
into the caller, and batching beside multiplexing (batches never mix models; each reads its own
model id)."""

import asyncio

import pytest

from modelplex import handle
from modelplex.wire.errors import EmptyModelId
from modelplex.wire.names import MODEL_ID_HEADER


async def replicas(session, stack, name):
    async with session.get(stack.url(name) + "/v1/replicas") as response:
        return {replica["name"]: set(replica["models"]) for replica in (await response.json())["replicas"]}


async def models_become(session, stack, name, expected, timeout_s=10.0):
    """The router's view of each replica's models, once it equals ``expected`` (as Ray's
    wait_for_condition: the view follows the replicas' reports)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (seen := list((await replicas(session, stack, name)).values())) != expected:
        if asyncio.get_running_loop().time() > deadline:
            return seen
        await asyncio.sleep(0.05)
    return seen


async def test_a_request_without_a_model_id_is_a_normal_request(stack, session):
    """Issue 31, item 5, as Ray's documents put it: "If the serve_multiplexed_model_id is not
    found in the request header, Serve will treat it as a normal request". The handler gets an
    empty id; only its loader, called without one, refuses with Ray's ValueError("The model ID
    cannot be empty.") (issue 40, item 7): a 400 naming the type over HTTP, a ValueError
    through a handle."""
    url = stack.url("loader") + "/"
    async with session.post(url, json={"peek": True}) as response:
        assert response.status == 200, await response.text()
        assert await response.json() == {"model_id": ""}
    async with session.post(url, json={}) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error == {"code": "bad_request", "message": "The model ID cannot be empty.", "type": "ValueError",
                     "hint": EmptyModelId.HINT}
    assert await handle("loader", url=stack.url("loader")).remote({"peek": True}) == {"model_id": ""}
    with pytest.raises(ValueError, match="The model ID cannot be empty."):
        await handle("loader", url=stack.url("loader")).remote({})


async def test_a_models_requests_stay_on_the_replica_that_loaded_it(stack, session):
    url = stack.url("loader") + "/"
    async with session.post(url, json={}, headers={MODEL_ID_HEADER: "1"}) as response:
        first_pid = (await response.json())["pid"]
    for _ in range(10):
        async with session.post(url, json={}, headers={MODEL_ID_HEADER: "1"}) as response:
            assert (await response.json())["pid"] == first_pid
    loader = handle("loader", url=stack.url("loader")).options(multiplexed_model_id="1")
    for _ in range(10):
        assert (await loader.remote("blabla"))["pid"] == first_pid
    assert any("1" in models for models in (await replicas(session, stack, "loader")).values())


async def test_the_least_recently_used_model_goes_first(stack, session):
    url = stack.url("lru") + "/"
    for model_id in ("1", "2", "1", "3"):  # 2 is the least recently used when 3 comes
        async with session.post(url, json={}, headers={MODEL_ID_HEADER: model_id}) as response:
            assert response.status == 200
    assert await models_become(session, stack, "lru", [{"1", "3"}]) == [{"1", "3"}]


async def test_the_router_learns_each_replicas_models_after_handle_calls(stack, session):
    lru = handle("lru", url=stack.url("lru"))
    for model_id in ("x", "y", "z"):
        await lru.options(multiplexed_model_id=model_id).remote(None)
    assert await models_become(session, stack, "lru", [{"y", "z"}]) == [{"y", "z"}]


async def test_a_model_id_set_on_a_handle_call_does_not_change_the_callers(stack):
    delegate = handle("delegate", url=stack.url("delegate"))
    assert await delegate.options(multiplexed_model_id="foo").model_ids.remote() == ["foo", "bar", "foo"]


async def until(condition, timeout_s=30.0):
    """Poll ``condition`` (a coroutine function) until it is true, as Ray's wait_for_condition."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_models_requests_spread_to_a_second_replica_when_the_first_is_busy(stack, session, tmp_path):
    flag = tmp_path / "go"
    name = "loader"  # two replicas, one request at a time each
    model_1 = handle(name, url=stack.url(name)).options(multiplexed_model_id="1")
    first, second = model_1.pid_once_released.remote(str(flag)), model_1.pid_once_released.remote(str(flag))

    async def both_running():
        async with session.get(stack.url(name) + "/v1/replicas") as response:
            return [replica["inflight"] for replica in (await response.json())["replicas"]] == [1, 1]

    await until(both_running)  # the second did not queue behind the first
    flag.touch()
    assert await first != await second
    assert any("1" in models for models in (await replicas(session, stack, name)).values())


def batched(stack, model_id):
    return handle("batched", url=stack.url("batched")).options(multiplexed_model_id=model_id)


async def test_batches_are_split_by_model_id(stack):
    before = len(await batched(stack, "").batches_by_model.remote())
    models = ["model_a" if i % 2 == 0 else "model_b" for i in range(6)]
    calls = [batched(stack, model).predict.remote(f"input_{i}") for i, model in enumerate(models)]
    assert await asyncio.gather(*calls) == [f"{model}:input_{i}" for i, model in enumerate(models)]
    batches = (await batched(stack, "").batches_by_model.remote())[before:]
    assert sorted((model, sorted(inputs)) for model, inputs in batches) == [
        ("model_a", ["input_0", "input_2", "input_4"]), ("model_b", ["input_1", "input_3", "input_5"])]


async def test_requests_for_one_model_share_a_batch(stack, tmp_path):
    flag = tmp_path / "go"
    before = len(await batched(stack, "").batches_by_model.remote())
    calls = [batched(stack, "same_model").predict.remote(f"input_{i}", str(flag)) for i in range(5)]

    async def at_barrier():
        return await batched(stack, "").batches_at_barrier.remote() == 1

    await until(at_barrier)
    flag.touch()
    assert sorted(await asyncio.gather(*calls)) == [f"same_model:input_{i}" for i in range(5)]
    batches = (await batched(stack, "").batches_by_model.remote())[before:]
    assert [(model, sorted(inputs)) for model, inputs in batches] == [
        ("same_model", [f"input_{i}" for i in range(5)])]


async def test_batches_of_different_models_run_at_once_and_each_reads_its_own_model_id(stack, tmp_path):
    flag = tmp_path / "go"
    models = ["model_a", "model_b", "model_c"]
    before = len(await batched(stack, "").batches_by_model.remote())
    calls = [batched(stack, model).predict.remote(f"{model}_input_{i}", str(flag)) for model in models
             for i in range(3)]

    async def all_at_barrier():
        return await batched(stack, "").batches_at_barrier.remote() == len(models)

    await until(all_at_barrier)  # three batches, one per model, wait together
    flag.touch()
    results = await asyncio.gather(*calls)
    assert all(result.startswith(f"{models[i // 3]}:") for i, result in enumerate(results)), results
    batches = (await batched(stack, "").batches_by_model.remote())[before:]
    assert sorted(model for model, _ in batches) == models
    assert all(all(item.startswith(model) for item in inputs) for model, inputs in batches), batches
