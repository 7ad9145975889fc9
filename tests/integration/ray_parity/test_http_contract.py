"""Ray Serve's HTTP contract through ``serve.run``, with Ray's documents' handlers (Getting Started,
the batching tutorial, the streaming guide, a function deployment), the import changed: a plain
deployment's ``__call__`` gets a ``starlette.requests.Request`` with the client's query string,
and its Starlette responses reach the client (issue 40, item 1)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import List

import aiohttp
import cloudpickle
from starlette.requests import Request

from modelplex import serve
from modelplex.serve import running

import support.ray_docs
from support.ray_docs import StreamingResponder, Translator
from support.stacks import consecutive_free_ports

# Shipped to the replicas by value, as a script's classes are (tests/ is not on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(support.ray_docs)


@serve.deployment
class BatchTextGenerator:
    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.2)
    async def handle_batch(self, inputs: List[str]) -> List[str]:
        return [f"{text.upper()} ({len(inputs)})" for text in inputs]

    async def __call__(self, request: Request) -> str:
        return await self.handle_batch(request.query_params["text"])


@serve.deployment(ray_actor_options={"runtime_env": {"env_vars": {"GREETING": "hello"}}})
def hello(request: Request) -> str:
    # runtime_env's env_vars reach the replica (they were accepted and dropped before issue 40).
    return f"{os.environ['GREETING']} {request.query_params['name']} at {request.url.path}"


async def test_rays_documented_http_handlers_run_through_serve_run_with_the_import_changed(monkeypatch):
    monkeypatch.setattr(running, "_http_options", None)  # serve.start's port, undone after the test
    port = consecutive_free_ports(1)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})  # Ray's way to move the HTTP port
        serve.run(Translator.bind(), name="translator", route_prefix="/translate")
        serve.run(BatchTextGenerator.bind(), name="batch", route_prefix="/generate")
        serve.run(StreamingResponder.bind(), name="stream", route_prefix="/numbers")
        serve.run(hello.bind(), name="hello", route_prefix="/hello")
        base = f"http://127.0.0.1:{port}"
        # A handle calls its methods by name, values in and out; HTTP gets Ray's Request.
        assert await serve.get_app_handle("translator").translate.remote("Hello world!") == "Bonjour monde!"
        status = serve.status().applications["translator"]
        assert status.deployments["Translator"].replica_states == {"RUNNING": 1}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.post(base + "/translate", json="Hello world!") as response:
                assert (response.status, await response.text()) == (200, "Bonjour monde!")

            async def generate(text: str) -> str:
                async with session.get(base + "/generate", params={"text": text}) as response:
                    assert response.status == 200
                    return await response.text()

            answers = await asyncio.gather(*(generate(f"w{i}") for i in range(4)))
            assert [answer.split(" ")[0] for answer in answers] == ["W0", "W1", "W2", "W3"]
            assert any(not answer.endswith("(1)") for answer in answers)  # batched together

            async with session.get(base + "/numbers?max=5") as response:
                assert (response.status, response.content_type) == (200, "text/plain")
                assert await response.text() == "01234"

            async with session.get(base + "/hello/there?name=ray") as response:
                assert (response.status, await response.text()) == (200, "hello ray at /hello/there")
    finally:
        serve.shutdown()
