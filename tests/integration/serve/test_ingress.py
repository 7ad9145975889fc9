"""``@serve.ingress``: a FastAPI app served by its deployment's replicas, over HTTP through the
router (``serve.run``, local mode), at the route prefix given to ``serve.run``."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

import aiohttp
import cloudpickle
import torch
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

import modelplex
from modelplex import serve

from support.stacks import consecutive_free_ports

# This module's functions go to the replicas by value, as a script's do: it is not importable
# there (pytest puts tests/ on the path only here).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    yield {"started": "by the lifespan"}


fastapi_app = FastAPI(lifespan=lifespan)


@fastapi_app.get("/health")
def health():
    return {"ok": True}


@serve.deployment
@serve.ingress(fastapi_app)
class Scorer:
    def __init__(self, scale: float, signals: str):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.scale = scale
        self.signals = Path(signals)

    @fastapi_app.post("/score")
    async def score(self, features: list[float]) -> dict:
        with torch.no_grad():  # synchronous torch work in an async route, as users write it
            value = self.model(torch.tensor(features, dtype=torch.float32)).item() * self.scale
        return {"score": value, "model": serve.get_multiplexed_model_id()}

    @fastapi_app.get("/words/{text}")
    def words(self, text: str, request: Request):
        go = self.signals / request.query_params["wait_for"]

        def generate():
            words = text.split("-")
            yield words[0].upper() + "\n"
            deadline = time.monotonic() + 60  # the rest only once the client has the first word
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            for word in words[1:]:
                yield word.upper() + "\n"

        return StreamingResponse(generate(), media_type="text/plain")

    @fastapi_app.get("/started")
    async def started(self, request: Request) -> str:
        return request.state.started

    @fastapi_app.delete("/fail")
    async def fail(self):
        raise ValueError("boom")


def expected_score(features: list[float], scale: float) -> float:
    torch.manual_seed(0)
    with torch.no_grad():
        return torch.nn.Linear(4, 1)(torch.tensor(features, dtype=torch.float32)).item() * scale


async def test_the_fastapi_app_answers_every_method_and_sub_path_at_the_route_prefix(tmp_path):
    port = consecutive_free_ports(1)
    ingress = serve.run(Scorer.bind(2.0, str(tmp_path)), route_prefix="/api", _port=port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            async with session.post(base + "/api/score", json=[1, 2, 3, 4],
                                    headers={"serve_multiplexed_model_id": "tenant-7"}) as response:
                answer = await response.json()
                assert response.status == 200, answer
            assert answer["model"] == "tenant-7"
            assert abs(answer["score"] - expected_score([1, 2, 3, 4], 2.0)) < 1e-5

            async with session.get(base + "/api/health") as response:
                assert (response.status, await response.json()) == (200, {"ok": True})
            async with session.get(base + "/api/started") as response:
                assert (response.status, await response.json()) == (200, "by the lifespan")
            async with session.post(base + "/api/score", json=["x"]) as response:
                assert response.status == 422  # FastAPI's own validation
            async with session.delete(base + "/api/fail") as response:
                assert response.status == 500
            async with session.get(base + "/api/nowhere") as response:
                assert response.status == 404  # the app's own 404
            async with session.get(base + "/score") as response:
                error = await response.json()
                assert response.status == 404 and "answers under /api" in error["error"]["message"]

            async with session.get(base + "/api/words/to-be-or-not", params={"wait_for": "go"}) as response:
                assert response.status == 200
                first = await asyncio.wait_for(response.content.readline(), 30)
                assert first == b"TO\n"  # streamed: the rest waits for the signal below
                (tmp_path / "go").touch()
                assert await response.content.read() == b"BE\nOR\nNOT\n"

        # Handles call the class's methods by name, whatever the route prefix.
        answer = await ingress.score.remote([4, 3, 2, 1])
        assert abs(answer["score"] - expected_score([4, 3, 2, 1], 2.0)) < 1e-5 and answer["model"] == ""
    finally:
        serve.shutdown()


@serve.deployment
class LoudShouter:
    def __call__(self, body):
        return body["text"].upper()


@serve.deployment
class Front:
    def __init__(self, shouter):
        self.shouter = shouter

    async def __call__(self, request: Request):
        body = await request.json()
        # Ray's class name, resolved inside this replica (its router is "loud-shouter").
        by_class_name = await modelplex.handle("LoudShouter").remote(body)
        return {"bound": await self.shouter.remote(body), "by_name": by_class_name}


async def test_a_plain_deployment_answers_only_under_its_prefix_and_finds_others_by_ray_class_name():
    port = consecutive_free_ports(2)
    serve.run(Front.bind(LoudShouter.bind()), route_prefix="/shout", _port=port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            for path in ("/shout", "/shout/any/sub/path?x=1"):
                async with session.put(base + path, json={"text": "hi"}) as response:
                    assert (response.status, await response.json()) == (200, {"bound": "HI", "by_name": "HI"})
            for path in ("/", "/shouting"):
                async with session.post(base + path, json={"text": "hi"}) as response:
                    assert response.status == 404, path
    finally:
        serve.shutdown()
