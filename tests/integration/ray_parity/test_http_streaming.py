"""Streams over plain HTTP through the router, as Ray's test_streaming_response.py and the
batched-generator test of test_batching.py check them."""

import asyncio
import time

import aiohttp

from modelplex.names import MODEL_ID_HEADER


async def test_a_sync_generator_streams_text(stack, session):
    """Sync generators used to answer 500 "internal"; now each item is computed in a thread."""
    async with session.post(stack.url("text-streamer") + "/", json={}) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "text/plain"
        assert await response.text() == "".join(f"hi_{i}" for i in range(10))


async def test_a_failure_mid_stream_cuts_a_text_stream(stack, session):
    async with session.post(stack.url("text-streamer") + "/", json={"kind": "fail"}) as response:
        assert response.status == 200
        first = await response.content.readany()
        assert first == b"first result"
        try:
            rest = await response.content.read()
        except aiohttp.ClientPayloadError:
            rest = None
    assert rest is None, f"a text stream that failed must be cut, not end with {rest!r}"


async def test_a_client_that_disconnects_closes_the_generator(stack, session, tmp_path):
    flag = tmp_path / "closed"
    async with session.post(stack.url("text-streamer") + "/", json={"kind": "disconnect", "flag": str(flag)}) \
            as response:
        assert await response.content.readany() == b"hi"
    # The connection is gone: the replica stops the generator, whose finally writes the flag.
    deadline = time.monotonic() + 10
    while not flag.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert flag.read_text() == "closed"


async def test_a_deployment_streams_over_http_what_a_handle_streams(stack, session):
    for target in ("async-streamer", "sync-streamer"):
        body = {"target": target}
        async with session.post(stack.url("delegate") + "/", json=body) as response:
            assert response.status == 200
        # Through Delegate.hi, called by a handle from this process over its router.
    from modelplex import handle

    delegate = handle("delegate", url=stack.url("delegate")).options(stream=True)
    for target in ("async-streamer", "sync-streamer"):
        assert [text async for text in delegate.hi.remote({"target": target})] == [f"hi_{i}" for i in range(10)]


async def test_four_http_clients_share_one_batched_generator(stack, session):
    async def ask(index):
        async with session.post(stack.url("batched") + "/", json={"prompt": f"hola{index}"}) as response:
            assert response.status == 200
            return await response.text()

    answers = await asyncio.gather(*(ask(index) for index in range(4)))
    assert answers == [f"hola{index}" * 10 for index in range(4)]


async def test_a_bytes_id_given_to_the_loader_fails_that_request_only(stack, session):
    """Bug 1 of the issue: a bytes body passed to the @multiplexed loader became a cache key,
    and every later GET /v1/models failed: the router marked the replica not ready for ever."""
    url = stack.url("loader") + "/"
    async with session.post(url, data=b"raw-bytes", headers={MODEL_ID_HEADER: "m1"}) as response:
        assert response.status == 500
        error = (await response.json())["error"]
    for model_id in ("m1", "org/m2"):  # the replica goes on serving
        async with session.post(url, json={}, headers={MODEL_ID_HEADER: model_id}) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["id"] == model_id
    async with session.get(stack.url("loader") + "/v1/replicas") as response:
        replicas = (await response.json())["replicas"]
    assert all(replica["ready"] for replica in replicas), replicas
    assert error["type"] == "TypeError" and "string" in error["message"]
