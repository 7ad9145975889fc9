"""The one client of GET /v1/models and its limits, against real aiohttp servers on loopback."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from modelplex.loaded_client import LOADED_MODELS_PATH, DocumentUnavailable, fetch_loaded_models
from modelplex.processes import free_port
from modelplex.wire.loaded import MAX_DOCUMENT_BYTES, LoadedModels

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
def hang() -> asyncio.Event:
    """What a handler that never answers waits for: set when the test ends, so the stand-in stops."""
    return asyncio.Event()


@pytest.fixture
async def replica(hang: asyncio.Event) -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Starts a stand-in replica whose GET /v1/models is the given handler; its base URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_get(LOADED_MODELS_PATH, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    yield start
    hang.set()
    for runner in runners:
        await runner.cleanup()


async def test_a_document_is_read_and_parsed(session, replica):
    document = LoadedModels(version=3, capacity=2, models=("a", "org/b"), model_bytes={"a": 5})

    async def models(request: web.Request) -> web.Response:
        return web.json_response(document.to_dict())

    assert await fetch_loaded_models(session, await replica(models)) == document


async def test_a_document_announced_over_the_size_limit_is_refused_unread(session, replica, hang):
    async def announced(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = MAX_DOCUMENT_BYTES + 1
        await response.prepare(request)
        await response.write(b"{")  # the client must not wait for the rest
        await hang.wait()
        return response

    with pytest.raises(DocumentUnavailable, match=f"over {MAX_DOCUMENT_BYTES} bytes") as raised:
        await fetch_loaded_models(session, await replica(announced), timeout_s=20)
    assert not raised.value.refused


async def test_a_document_without_a_length_is_cut_off_past_the_size_limit(session, replica):
    sent = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"models": ["')
        chunk = b"x" * (1 << 20)
        for _ in range(4 * (MAX_DOCUMENT_BYTES >> 20)):  # bounded: four times the limit at most
            await response.write(chunk)
            sent += len(chunk)
        return response

    with pytest.raises(DocumentUnavailable, match=f"over {MAX_DOCUMENT_BYTES} bytes"):
        await fetch_loaded_models(session, await replica(endless), timeout_s=60)
    assert sent < 4 * MAX_DOCUMENT_BYTES  # the client stopped reading


@pytest.mark.parametrize("body, reason", [
    (b"not json", "malformed document"),
    (b'{"models": [1]}', "malformed document: models"),
    (b"[]", "malformed document: expected a JSON object"),
])
async def test_a_malformed_document_is_refused_saying_what_is_wrong(session, replica, body, reason):
    async def models(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    with pytest.raises(DocumentUnavailable, match=reason):
        await fetch_loaded_models(session, await replica(models))


async def test_an_error_status_is_refused_with_the_status(session, replica):
    async def failing(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "internal", "message": "x"}}, status=500)

    with pytest.raises(DocumentUnavailable, match="answered HTTP 500"):
        await fetch_loaded_models(session, await replica(failing))


async def test_a_replica_that_answers_nothing_in_time_is_given_up(session, replica, hang):
    async def frozen(request: web.Request) -> web.Response:
        await hang.wait()
        return web.Response()

    with pytest.raises(DocumentUnavailable, match="no answer within 0.2 s") as raised:
        await fetch_loaded_models(session, await replica(frozen), timeout_s=0.2)
    assert not raised.value.refused


async def test_nothing_listening_is_a_refusal(session):
    with pytest.raises(DocumentUnavailable) as raised:
        await fetch_loaded_models(session, f"http://127.0.0.1:{free_port()}")
    assert raised.value.refused
