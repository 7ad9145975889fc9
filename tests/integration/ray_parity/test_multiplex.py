"""Multiplexing end to end, as Ray's test_multiplex.py checks it: a model's requests stay on
the replica that holds it (over HTTP and through handles), LRU eviction as the router sees it,
and a handle's model id that does not leak into the caller."""

import asyncio

from modelplex import handle
from modelplex.names import MODEL_ID_HEADER


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
