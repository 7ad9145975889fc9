"""Handles as the Serve API uses them: Ray's class names resolve to the DNS-label deployment, and
Ray's object references (``_to_object_ref``, ``_to_object_ref_gen``) pass their values on."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from modelplex.handles import ObjectRef, handle, resolve
from modelplex.wire.codec import STREAM_CONTENT_TYPE, VALUE_CONTENT_TYPE, decode_call, encode_stream_item, encode_value


def test_rays_class_name_finds_the_router_local_mode_names_by_its_label(monkeypatch):
    monkeypatch.setenv("MODELPLEX_ROUTER_SIMPLE_MODEL", "http://127.0.0.1:8001/")
    monkeypatch.delenv("MODELPLEX_ROUTER_SIMPLEMODEL", raising=False)
    assert resolve("SimpleModel") == resolve("simple-model") == "http://127.0.0.1:8001"


def test_in_a_cluster_rays_class_name_is_the_service_of_its_label(monkeypatch):
    monkeypatch.delenv("MODELPLEX_ROUTER_SIMPLEMODEL", raising=False)
    monkeypatch.delenv("MODELPLEX_ROUTER_SIMPLE_MODEL", raising=False)
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    assert resolve("SimpleModel") == "http://simple-model.team-a.svc:8000"


@pytest.fixture
async def echo_server():
    """A deployment stand-in on loopback: ``items`` streams its argument's items, anything else
    answers with the call's arguments as it received them."""

    async def invoke(request: web.Request) -> web.StreamResponse:
        call = decode_call(await request.read())
        if call.method == "items":
            response = web.StreamResponse(headers={"Content-Type": STREAM_CONTENT_TYPE})
            await response.prepare(request)
            for item in call.args[0]:
                await response.write(encode_stream_item(item))
            await response.write_eof()
            return response
        return web.Response(body=encode_value([call.args, call.kwargs]), content_type=VALUE_CONTENT_TYPE)

    app = web.Application()
    app.router.add_post("/", invoke)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


async def test_a_streams_items_as_references_arrive_in_the_next_call_as_the_items(echo_server):
    deployment = handle("echo", url=echo_server)
    references = await deployment.options(stream=True).items.remote([b"frame-0", (1, 2), None])._to_object_ref_gen()
    received = [ref async for ref in references]
    assert all(isinstance(ref, ObjectRef) for ref in received)
    assert await received[1] == (1, 2)  # a reference awaits to its value, as Ray's do
    args, kwargs = await deployment.run.remote(received[0], *received[1:], last=received[2])
    assert (args, kwargs) == ((b"frame-0", (1, 2), None), {"last": None})


async def test_a_responses_reference_carries_its_answer(echo_server):
    deployment = handle("echo", url=echo_server)
    ref = await deployment.run.remote("x")._to_object_ref()
    assert await ref == [("x",), {}]
    assert await deployment.run.remote(ref) == [([("x",), {}],), {}]


@pytest.fixture
async def endless_server():
    """A streaming deployment stand-in on loopback that sends an item every 10 ms (for up to
    30 s) and sets ``hung_up`` when its client closes the connection."""
    hung_up = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": STREAM_CONTENT_TYPE})
        await response.prepare(request)
        try:
            for i in range(3000):
                await response.write(encode_stream_item(i))
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            hung_up.set()
            raise
        return response

    app = web.Application()
    app.router.add_post("/", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", hung_up
    finally:
        await runner.cleanup()


async def test_a_stream_whose_reader_was_cancelled_before_its_read_began_still_hangs_up(endless_server):
    url, hung_up = endless_server
    stream = handle("endless", url=url).options(stream=True).remote()
    assert await stream.__anext__() == 0
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)  # the reader has asked for the next item; the read has not begun
    reader.cancel()  # as a pipeline cancels its feeder when a later stage fails
    with pytest.raises(asyncio.CancelledError):
        await reader
    await stream.aclose()
    await asyncio.wait_for(hung_up.wait(), 10)
