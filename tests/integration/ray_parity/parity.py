"""Deployments for the Ray parity tests, written as Ray Serve's own tests write theirs
(``python/ray/serve/tests/test_batching.py``, ``test_handle_streaming.py``,
``test_streaming_response.py``, ``test_multiplex.py``), with only the SDK's import changed.
Ray's signal actor is a flag file the test creates."""

import asyncio
import os
import time
from pathlib import Path

import numpy
import torch
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from modelplex import batch, get_multiplexed_model_id, handle, multiplexed, serve

#: How long a deployment waits for a test's flag file at most.
FLAG_WAIT_S = 60


def wait_for_flag(flag: str) -> None:
    deadline = time.monotonic() + FLAG_WAIT_S
    while not Path(flag).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


async def wait_for_flag_async(flag: str) -> None:
    deadline = time.monotonic() + FLAG_WAIT_S
    while not Path(flag).exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


class Batched:
    """The seed's SimpleBatchedModel, and Ray's batching deployments, as methods."""

    def __init__(self):
        self.batches = []
        self.count = 0
        self.by_model = []
        self.at_barrier = 0
        self.in_flight = {"batches": 0, "requests": 0}
        self.sizes = []

    @batch(batch_wait_timeout_s=0.1, max_batch_size=4)
    async def run(self, multiple_samples: list[int]) -> list[int]:
        self.batches.append(len(multiple_samples))
        return [sample * 2 for sample in multiple_samples]

    def batch_sizes(self) -> list[int]:
        return self.batches

    @batch(max_batch_size=5, batch_wait_timeout_s=1)
    async def counted(self, requests):
        self.count += 1
        return [self.count] * len(requests)

    @batch(max_batch_size=5)
    async def not_a_list(self, requests):
        return len(requests)

    @batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def pairs(self, key1, key2):
        return [(key1[i], key2[i]) for i in range(len(key1))]

    @batch(max_batch_size=4, batch_wait_timeout_s=1000)
    async def textgen(self, prompts: list[str]):
        for _ in range(10):
            yield prompts

    async def __call__(self, body):
        """Over HTTP: a prompt streams back from the batched generator."""
        async for text in self.textgen(body["prompt"]):
            yield text

    # Batching with multiplexing (Ray's test_multiplex.py): batches never mix models, and each
    # batch reads its own model id even while other models' batches run beside it. (No
    # @multiplexed loader here: it would make a model id required on every call.)
    @batch(max_batch_size=10, batch_wait_timeout_s=1.0)
    async def predict(self, inputs: list[str], flags: list[str | None] = None):
        if flags[0] is not None:  # a barrier: every batch waits for the test's flag
            self.at_barrier += 1
            await wait_for_flag_async(flags[0])
            self.at_barrier -= 1
        model_id = get_multiplexed_model_id()  # read after waiting: other models' batches ran meanwhile
        self.by_model.append((model_id, inputs))
        return [f"{model_id}:{item}" for item in inputs]

    def batches_by_model(self) -> list:
        return self.by_model

    @batch(max_batch_size=5, batch_wait_timeout_s=1, max_concurrent_batches=2)
    async def concurrent(self, requests):
        """Each answer says how many batches and requests were in flight half way through."""
        self.in_flight["batches"] += 1
        self.in_flight["requests"] += len(requests)
        await asyncio.sleep(0.5)
        answers = [(request, self.in_flight["batches"], self.in_flight["requests"]) for request in requests]
        await asyncio.sleep(0.5)
        self.in_flight["batches"] -= 1
        self.in_flight["requests"] -= len(requests)
        return answers

    @batch(max_batch_size=5)
    async def quick(self, requests):
        await asyncio.sleep(0.05)
        return ["fake-response"] * len(requests)

    @batch(max_batch_size=3)
    async def digits(self, requests):
        await asyncio.sleep(0.05)
        for i in range(10):
            yield [str(i)] * len(requests)

    # batch_size_fn: a batch is full by the sum of its requests' sizes (tokens, graph nodes), not their count.
    @batch(max_batch_size=100, batch_wait_timeout_s=0.5, batch_size_fn=lambda items: sum(i["size"] for i in items))
    async def by_size(self, requests):
        self.sizes.append(sum(request["size"] for request in requests))
        return [request["value"] for request in requests]

    @batch(max_batch_size=10, batch_wait_timeout_s=0.5, batch_size_fn=lambda items: sum(i["size"] for i in items))
    async def by_size_10(self, requests):
        self.sizes.append(sum(request["size"] for request in requests))
        return [request["value"] for request in requests]

    # Ray's GraphBatcher (test_batch_size_fn_graph_nodes), its Graph objects as JSON: nodes and
    # edges (handle arguments are JSON, not pickles).
    @batch(max_batch_size=100, batch_wait_timeout_s=0.5, batch_size_fn=lambda graphs: sum(len(g["nodes"]) for g in graphs))
    async def process_graphs(self, graphs):
        self.sizes.append(sum(len(graph["nodes"]) for graph in graphs))
        return [graph["graph_id"] * len(graph["nodes"]) for graph in graphs]

    @batch(max_batch_size=1000, batch_wait_timeout_s=0.5,
           batch_size_fn=lambda sequences: sum(len(sequence.split()) for sequence in sequences))
    async def by_tokens(self, sequences):
        return [len(sequence.split()) for sequence in sequences]

    def batch_sizes_by_size_fn(self) -> list[int]:
        return self.sizes

    def batches_at_barrier(self) -> int:
        return self.at_barrier


class ReturnsStreams:
    """A ``__call__`` that *returns* a stream rather than being a generator (Ray streams both
    over HTTP): a generator, an async generator, or a ``@batch`` generator's stream."""

    @batch(max_batch_size=4, batch_wait_timeout_s=1000)
    async def textgen(self, prompts: list[str]):
        for _ in range(10):
            yield prompts

    def sync_numbers(self, n: int):
        for i in range(n):
            yield f"{i}"

    async def async_numbers(self, n: int):
        for i in range(n):
            yield f"{i}"

    def pick(self, body):
        if body["kind"] == "batched":
            return self.textgen(body["prompt"])
        return (self.sync_numbers if body["kind"] == "sync" else self.async_numbers)(body["n"])

    async def __call__(self, body):
        return self.pick(body)


class SyncReturnsStreams(ReturnsStreams):
    """The same from a blocking ``__call__`` (it runs in a worker thread)."""

    def __call__(self, body):
        return self.pick(body)


class AsyncStreamer:
    async def __call__(self, n: int, should_error: bool = False):
        if should_error:
            raise RuntimeError("oopsies")
        for i in range(n):
            yield i

    async def other_method(self, n: int):
        for i in range(n):
            yield i

    async def call_inner_generator(self, n: int):
        return self.other_method(n)

    async def unary(self, n: int) -> int:
        return n

    async def hi(self):
        for i in range(10):
            yield f"hi_{i}"


class SyncStreamer:
    def __call__(self, n: int, should_error: bool = False):
        if should_error:
            raise RuntimeError("oopsies")
        yield from range(n)

    def other_method(self, n: int):
        yield from range(n)

    def call_inner_generator(self, n: int):
        return self.other_method(n)

    def unary(self, n: int) -> int:
        return n

    def hi(self):
        for i in range(10):
            yield f"hi_{i}"


def sync_gen_function(n: int):
    """A generator function as a deployment (Ray's TestGeneratorFunctionDeployment)."""
    yield from range(n)


async def async_gen_function(n: int):
    for i in range(n):
        yield i


class TextStreamer:
    """Plain HTTP streams, as Ray's StreamingResponse tests send them."""

    def __call__(self, body):
        kind = body.get("kind")
        if kind == "fail":
            yield "first result"
            raise RuntimeError("raised in generator")
        if kind == "until":
            yield from until_flag_sync(body["flag"])
            return
        if kind == "disconnect":
            yield from self._until_cancelled(Path(body["flag"]), body.get("gap_s", 0.1))
            return
        for i in range(10):
            yield f"hi_{i}"

    @staticmethod
    def _until_cancelled(flag: Path, gap_s: float):
        """"hi", then "." every ``gap_s`` (a sync generator learns it was closed at its next yield)."""
        try:
            yield "hi"
            for _ in range(int(60 / gap_s)):  # at most 60 s
                time.sleep(gap_s)
                yield "."
        finally:
            flag.write_text("closed")


def hi_sync():
    for i in range(10):
        yield f"hi_{i}"


async def hi_async():
    for i in range(10):
        yield f"hi_{i}"


def until_flag_sync(flag: str):
    yield f"{os.getpid()}: before signal"
    wait_for_flag(flag)
    yield f"{os.getpid()}: after signal"


async def until_flag_async(flag: str):
    yield f"{os.getpid()}: before signal"
    await wait_for_flag_async(flag)
    yield f"{os.getpid()}: after signal"


def failing_sync():
    yield "first result"
    raise RuntimeError("raised in generator")


async def failing_async():
    yield "first result"
    raise RuntimeError("raised in generator")


class AsyncTextStreamer:
    """TextStreamer's plain HTTP streams, from an async generator; and what a handle streams."""

    async def __call__(self, body):
        kind = body.get("kind")
        if kind == "fail":
            yield "first result"
            raise RuntimeError("raised in generator")
        if kind == "proxy":
            async for text in handle(body["target"]).options(stream=True).hi.remote():
                yield text
            return
        stream = until_flag_async(body["flag"]) if kind == "until" else hi_async()
        async for text in stream:
            yield text


streaming_app = FastAPI()


@serve.ingress(streaming_app)
class StreamingApp:
    """Ray's FastAPI tests: a route returns Starlette's StreamingResponse; a route calls a batched method."""

    def __init__(self):
        self.streamers = {name: handle(name) for name in ("async-streamer", "sync-streamer")}

    @streaming_app.get("/hi")
    def hi(self, kind: str) -> StreamingResponse:
        return StreamingResponse(hi_async() if kind == "async" else hi_sync(), media_type="text/plain")

    @streaming_app.get("/until")
    def until(self, kind: str, flag: str) -> StreamingResponse:
        generator = until_flag_async(flag) if kind == "async" else until_flag_sync(flag)
        return StreamingResponse(generator, media_type="text/plain")

    @streaming_app.get("/metadata")
    def metadata(self) -> StreamingResponse:
        return StreamingResponse(hi_sync(), status_code=301, headers={"hello": "world"}, media_type="foo/bar")

    @streaming_app.get("/fail")
    def fail(self, kind: str) -> StreamingResponse:
        return StreamingResponse(failing_async() if kind == "async" else failing_sync(), media_type="text/plain")

    @streaming_app.get("/proxy")
    def proxy(self, target: str) -> StreamingResponse:
        return StreamingResponse(self.streamers[target].options(stream=True).hi.remote(), media_type="text/plain")

    @batch(max_batch_size=10, batch_wait_timeout_s=0.5, batch_size_fn=lambda items: sum(i["size"] for i in items))
    async def by_size(self, requests):
        return [request["value"] for request in requests]

    @streaming_app.post("/sized")
    async def sized(self, request: Request):
        return await self.by_size(await request.json())


class Echo:
    """Types and errors across a handle."""

    def echo(self, *args, **kwargs):
        return args, kwargs

    def types(self, *args):
        return [type(arg).__name__ for arg in args]

    def tensor_sum(self, tensor):
        assert isinstance(tensor, torch.Tensor)
        return tensor.sum(dim=0)

    def array_double(self, array):
        assert isinstance(array, numpy.ndarray)
        return array * 2

    def fail(self, kind: str):
        if kind == "zero":
            return 1 / 0
        if kind == "key":
            return {}["missing"]

        class QuotaExceeded(Exception):
            pass

        raise QuotaExceeded("tenant over quota")

    def unsendable(self):
        return object()

    def model(self):
        return get_multiplexed_model_id()

    async def __call__(self, body):
        if body == {"unsendable": True}:
            return {1, 2}  # JSON has no sets: the answer cannot be sent over plain HTTP
        return {"body": body, "type": type(body).__name__}


class OnlyMethods:
    """No __call__: reachable through handles only."""

    def double(self, x):
        return 2 * x


class Nothing:
    """Nothing a request could call."""


class Loader:
    """Passes what it is given to its @multiplexed loader: a bytes body must not break it."""

    @multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        return {"id": model_id}

    async def __call__(self, body):
        if body == {"peek": True}:  # a request that needs no model: it runs without an id too
            return {"model_id": get_multiplexed_model_id()}
        model_id = body if isinstance(body, bytes) else get_multiplexed_model_id()
        return {**await self.get_model(model_id), "pid": os.getpid()}

    async def pid_once_released(self, flag: str) -> int:
        """Holds its replica's one slot (maxOngoingRequests 1) until the flag exists."""
        await self.get_model(get_multiplexed_model_id())
        await wait_for_flag_async(flag)
        return os.getpid()


class Delegate:
    """Calls the streamers through handles from inside a deployment, as Ray's Delegate does."""

    def __init__(self):
        self.streamers = {name: handle(name) for name in ("async-streamer", "sync-streamer")}
        self.functions = {name: handle(name) for name in ("sync-gen-function", "async-gen-function")}

    async def __call__(self, body):
        h = self.streamers[body["target"]].options(stream=True)
        got = {
            "call": [i async for i in h.remote(5)],
            "other": [i async for i in h.other_method.remote(5)],
            "by_option": [i async for i in h.options(method_name="other_method").remote(5)],
            "inner": [i async for i in h.call_inner_generator.remote(5)],
            "unary": await h.options(stream=False).unary.remote(5),
        }
        first, second = h.remote(1), h.remote(2)
        got["interleaved"] = [await first.__anext__(), await second.__anext__(), await second.__anext__()]
        for stream in (first, second):
            try:
                await stream.__anext__()
            except StopAsyncIteration:
                got["interleaved"].append("end")
        return got

    async def hi(self, body):
        """Streams what a handle streams (Ray's proxy-from-a-streaming-handle test)."""
        async for text in self.streamers[body["target"]].options(stream=True).hi.remote():
            yield text

    async def model_ids(self):
        """Setting a model id on a handle call leaves the caller's own unchanged."""
        before = get_multiplexed_model_id()
        other = await handle("echo").options(multiplexed_model_id="bar").model.remote()
        return [before, other, get_multiplexed_model_id()]

    async def chained(self, x: int):
        """A response passed as an argument is awaited first."""
        echo = handle("echo")
        first = echo.echo.remote(x)
        return await echo.echo.remote(first)

    async def function_streams(self) -> dict:
        """Generator-function deployments streamed from inside a deployment."""
        return {name: [i async for i in h.options(stream=True).remote(5)] for name, h in self.functions.items()}
