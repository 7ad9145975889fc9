"""Ray Serve's HTTP contract for a plain deployment: ``__call__`` gets a ``starlette.requests.Request``
and may return Starlette responses (``spec.http.request: starlette``, which ``serve.run`` and
``modelplex build`` write). The handlers are those of Ray's documents (Getting Started, the batching
tutorial, the streaming guide, function deployments), with the import changed; each runs in a real
replica app on loopback, sent requests as the router forwards them (the client's method and raw
path with its query string in the router's headers)."""

from __future__ import annotations

import asyncio
from typing import List

import pytest
from aiohttp.test_utils import TestClient, TestServer
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from modelplex import serve
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX, METHOD_HEADER, PATH_HEADER
from modelplex.wire.spec import parse_deployment
from modelplex_replica.app import create_app

from support.ray_docs import StreamingResponder, Translator


def deployment(request: str | None = "starlette"):
    spec = {"image": "x", "handler": "m:H", **({"http": {"request": request}} if request else {})}
    return parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                             "metadata": {"name": "h"}, "spec": spec})


@pytest.fixture
async def replica(monkeypatch):
    """Starts a replica app for a handler; each is closed at the end of the test."""
    monkeypatch.setenv(ENV_ROUTE_PREFIX, "/")
    clients: list[TestClient] = []

    async def start(handler, request: str | None = "starlette") -> TestClient:
        client = TestClient(TestServer(create_app(deployment(request), handler), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


def routed(method: str, path: str, **headers: str) -> dict[str, str]:
    """The headers the router adds: the client's method and raw path (its query string included)."""
    return {METHOD_HEADER: method, PATH_HEADER: path, **headers}


# -- Ray's Getting Started: `english_text: str = await http_request.json()` --------------------------

async def test_getting_started_reads_the_json_body_of_a_starlette_request(replica):
    client = await replica(Translator.func_or_class())
    async with client.post("/v1/invoke", json="Hello world!", headers=routed("POST", "/")) as response:
        assert (response.status, await response.text()) == (200, "Bonjour monde!")  # a str is text, as in Ray


# -- Ray's batching tutorial: `@serve.batch` behind a __call__ that takes the Request --------------------

@serve.deployment
class BatchTextGenerator:
    def __init__(self):
        self.batches: list[int] = []

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.5)
    async def handle_batch(self, inputs: List[str]) -> List[str]:
        self.batches.append(len(inputs))
        return [text.upper() for text in inputs]

    async def __call__(self, request: Request) -> str:
        return await self.handle_batch(request.query_params["text"])


async def test_the_batching_tutorial_batches_requests_read_from_their_query_strings(replica):
    generator = BatchTextGenerator.func_or_class()
    client = await replica(generator)

    async def ask(text: str) -> str:
        async with client.post("/v1/invoke", headers=routed("GET", f"/?text={text}")) as response:
            assert response.status == 200
            return await response.text()

    answers = await asyncio.gather(*(ask(f"word{i}") for i in range(4)))
    assert answers == [f"WORD{i}" for i in range(4)]
    assert generator.batches == [4]


@serve.deployment
class BatchedCall:
    """`@serve.batch` on `__call__` itself: the batch is a list of Requests."""

    @serve.batch(max_batch_size=3, batch_wait_timeout_s=0.5)
    async def __call__(self, requests: List[Request]) -> List[dict]:
        bodies = [await request.json() for request in requests]
        return [{"n": body["n"] * 2, "batch": len(requests), "method": request.method}
                for body, request in zip(bodies, requests)]


async def test_a_batched_call_gets_a_list_of_requests(replica):
    client = await replica(BatchedCall.func_or_class())

    async def ask(n: int) -> dict:
        async with client.post("/v1/invoke", json={"n": n}, headers=routed("PUT", "/")) as response:
            return await response.json()

    assert await asyncio.gather(*(ask(n) for n in range(3))) == [
        {"n": 2 * n, "batch": 3, "method": "PUT"} for n in range(3)]


# -- Ray's streaming guide: a StreamingResponse over a generator -----------------------------------------

async def test_the_streaming_guide_streams_a_starlette_streaming_response_one_chunk_per_item(replica):
    client = await replica(StreamingResponder.func_or_class())
    async with client.post("/v1/invoke", headers=routed("GET", "/?max=5")) as response:
        assert response.status == 200 and response.content_type == "text/plain"
        chunks = [chunk async for chunk, _ in response.content.iter_chunks()]
    assert b"".join(chunks) == b"01234"
    assert [chunk for chunk in chunks if chunk] == [b"0", b"1", b"2", b"3", b"4"]


# -- function deployments, and what a Request carries ----------------------------------------------------

@serve.deployment
def hello(request: Request) -> str:
    return "hello " + request.query_params["name"]


async def test_a_function_deployment_gets_the_request(replica):
    client = await replica(hello.func_or_class)
    async with client.post("/v1/invoke", headers=routed("GET", "/v1/models/m/predict?name=serve")) as response:
        assert (response.status, await response.text()) == (200, "hello serve")


@serve.deployment
class Inspector:
    async def __call__(self, request: Request) -> dict:
        return {"method": request.method, "path": request.url.path, "query": dict(request.query_params),
                "header": request.headers.get("x-user"), "path_params": request.path_params,
                "body": (await request.body()).decode(), "url_query": request.url.query,
                "internal": [name for name in request.headers if name.startswith("x-modelplex-")]}


async def test_the_request_has_the_clients_method_path_query_headers_and_body(replica):
    client = await replica(Inspector.func_or_class())
    async with client.post("/v1/invoke", data=b"raw bytes", headers=routed(
            "PATCH", "/a/b?x=1&y=two", **{"X-User": "ada", "Content-Type": "text/plain"})) as response:
        assert response.status == 200, await response.text()
        assert await response.json() == {
            "method": "PATCH", "path": "/a/b", "query": {"x": "1", "y": "two"}, "header": "ada",
            "path_params": {}, "body": "raw bytes", "url_query": "x=1&y=two", "internal": []}


# -- Starlette responses returned ------------------------------------------------------------------------

@serve.deployment
class Responder:
    def __call__(self, request: Request):
        kind = request.query_params["kind"]
        if kind == "json":
            return JSONResponse({"a": 1}, status_code=201)
        if kind == "text":
            return PlainTextResponse("plain", headers={"X-Extra": "yes"})
        return Response(b"\x00\x01", status_code=418, headers={"hello": "world"}, media_type="foo/bar")


@pytest.mark.parametrize("kind, status, content_type, body, header", [
    ("json", 201, "application/json", b'{"a":1}', None),
    ("text", 200, "text/plain", b"plain", ("X-Extra", "yes")),
    ("raw", 418, "foo/bar", b"\x00\x01", ("hello", "world")),
])
async def test_a_returned_starlette_response_keeps_its_status_headers_and_body(replica, kind, status, content_type,
                                                                               body, header):
    client = await replica(Responder.func_or_class())
    async with client.post("/v1/invoke", headers=routed("GET", f"/?kind={kind}")) as response:
        assert (response.status, response.content_type, await response.read()) == (status, content_type, body)
        if header:
            assert response.headers[header[0]] == header[1]


# -- the native contract stays where it was chosen -------------------------------------------------------

class BodyHandler:
    async def __call__(self, body):
        return {"got": body}


async def test_a_native_manifest_keeps_the_body_contract_unless_it_asks_for_starlette(replica):
    client = await replica(BodyHandler(), request=None)
    async with client.post("/v1/invoke", json={"x": 1}, headers=routed("POST", "/")) as response:
        assert await response.json() == {"got": {"x": 1}}
    client = await replica(Inspector.func_or_class(), request="body")
    async with client.post("/v1/invoke", json={"x": 1}, headers=routed("POST", "/")) as response:
        assert response.status == 500  # a dict has no .method: the body contract, as the manifest says
