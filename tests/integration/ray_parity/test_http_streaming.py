"""Streams over plain HTTP through the router, as Ray's test_streaming_response.py and the
batched-generator test of test_batching.py check them: a plain deployment's sync or async
generator, and a ``serve.ingress`` FastAPI route returning Starlette's StreamingResponse.

Each streaming deployment here has two replicas: requests without a model id go to the least
busy one (so two at once go to both), requests for one model id to the replica it hashes to
(so two at once go to the same one)."""

import asyncio
import time

import aiohttp
import pytest

from modelplex.wire.names import MODEL_ID_HEADER

KINDS = ["sync", "async"]
#: A plain deployment whose __call__ is a sync or an async generator.
PLAIN = {"sync": "text-streamer", "async": "async-text-streamer"}
HI = "".join(f"hi_{i}" for i in range(10))


def app(stack, path):
    return stack.url("streaming-app") + path


@pytest.mark.parametrize("kind", KINDS)
async def test_a_generator_streams_text_one_chunk_per_item(stack, session, kind):
    """Sync generators used to answer 500 "internal"; now each item is computed in a thread."""
    async with session.post(stack.url(PLAIN[kind]) + "/", json={}) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "text/plain"
        chunks = [chunk async for chunk, _ in response.content.iter_chunks() if chunk]
    # One HTTP chunk per item, as Ray sends them (Ray's client reads 'hi_0', then 'hi_1').
    assert chunks == [f"hi_{i}".encode() for i in range(10)], chunks


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failure_mid_stream_cuts_a_text_stream(stack, session, kind):
    async with session.post(stack.url(PLAIN[kind]) + "/", json={"kind": "fail"}) as response:
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


@pytest.mark.parametrize("target", ["async-streamer", "sync-streamer"])
async def test_a_generator_streams_over_http_what_a_handle_streams(stack, session, target):
    async with session.post(stack.url("async-text-streamer") + "/", json={"kind": "proxy", "target": target}) \
            as response:
        assert response.status == 200, await response.text()
        assert await response.text() == HI


async def test_four_http_clients_share_one_batched_generator(stack, session):
    async def ask(index):
        async with session.post(stack.url("batched") + "/", json={"prompt": f"hola{index}"}) as response:
            assert response.status == 200
            return await response.text()

    answers = await asyncio.gather(*(ask(index) for index in range(4)))
    assert answers == [f"hola{index}" * 10 for index in range(4)]


@pytest.mark.parametrize("deployment", ["returns-streams", "sync-returns-streams"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_that_returns_a_generator_streams_it(stack, session, deployment, kind):
    """Issue 31, item 7: it answered 500 ("use .options(stream=True)", which HTTP cannot send)."""
    async with session.post(stack.url(deployment) + "/", json={"kind": kind, "n": 5}) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "text/plain"
        assert await response.text() == "01234"


@pytest.mark.parametrize("deployment", ["returns-streams", "sync-returns-streams"])
async def test_four_http_clients_share_the_batched_stream_a_call_returns(stack, session, deployment):
    """Ray's test_batch_generator_streaming_response_integration_test, with the stream returned
    as it is (it was 500: "not JSON serializable: _BatchedStream")."""
    async def ask(index):
        async with session.post(stack.url(deployment) + "/", json={"kind": "batched", "prompt": f"hola{index}"}) \
                as response:
            assert response.status == 200, await response.text()
            return await response.text()

    answers = await asyncio.gather(*(ask(index) for index in range(4)))
    assert answers == ["".join([f"hola{index}"] * 10) for index in range(4)]


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


# -- a FastAPI route's StreamingResponse (Ray's use_fastapi=True variants) ---------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fastapi_streaming_response_streams_a_generator(stack, session, kind):
    async with session.get(app(stack, "/hi"), params={"kind": kind}) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "text/plain"
        assert await response.text() == HI


async def test_a_fastapi_streaming_response_keeps_its_status_headers_and_media_type(stack, session):
    async with session.get(app(stack, "/metadata"), allow_redirects=False) as response:
        assert response.status == 301
        assert response.headers["hello"] == "world"
        assert response.headers["content-type"] == "foo/bar"
        assert await response.text() == HI


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fastapi_stream_that_fails_midway_is_cut(stack, session, kind):
    async with session.get(app(stack, "/fail"), params={"kind": kind}) as response:
        assert response.status == 200
        assert await response.content.readany() == b"first result"
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.content.read()


@pytest.mark.parametrize("target", ["async-streamer", "sync-streamer"])
async def test_a_fastapi_route_streams_what_a_handle_streams(stack, session, target):
    async with session.get(app(stack, "/proxy"), params={"target": target}) as response:
        assert response.status == 200, await response.text()
        assert await response.text() == HI


# -- actually streamed: a chunk arrives while its generator still waits -----------------------------


async def two_streams_before_and_after_a_signal(open_stream, flag) -> list[str]:
    """Open two streams whose generators yield once, wait for ``flag``, then yield again. Each
    first chunk must arrive while both generators wait, and nothing more until the flag exists.
    Returns the pid each stream came from."""
    async with open_stream() as first, open_stream() as second:
        pids = []
        for response in (first, second):
            assert response.status == 200
            text = (await asyncio.wait_for(response.content.readany(), 30)).decode()
            assert text.endswith(": before signal"), text
            pids.append(text.split(":")[0])
        nexts = [asyncio.ensure_future(response.content.readany()) for response in (first, second)]
        done, _ = await asyncio.wait(nexts, timeout=0.3)
        assert not done  # both generators are still waiting for the signal
        flag.touch()
        for response, pid, following in zip((first, second), pids, nexts):
            rest = (await asyncio.wait_for(following, 30) + await response.content.read()).decode()
            assert rest == f"{pid}: after signal"
    return pids


@pytest.mark.parametrize("replicas", ["one replica", "two replicas"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("route", ["fastapi", "plain"])
async def test_two_streams_arrive_as_yielded(stack, session, tmp_path, route, kind, replicas):
    flag = tmp_path / "go"
    headers = {MODEL_ID_HEADER: "pinned"} if replicas == "one replica" else {}
    if route == "fastapi":
        def open_stream():
            return session.get(app(stack, "/until"), params={"kind": kind, "flag": str(flag)}, headers=headers)
    else:
        def open_stream():
            return session.post(stack.url(PLAIN[kind]) + "/", json={"kind": "until", "flag": str(flag)},
                                headers=headers)

    pids = await two_streams_before_and_after_a_signal(open_stream, flag)
    assert (pids[0] == pids[1]) == (replicas == "one replica"), pids
