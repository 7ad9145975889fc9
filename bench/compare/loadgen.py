"""The one load generator both systems get: aiohttp, closed loop, bounded in count and time.

Every function takes a base URL and POSTs JSON to ``URL/``, the ingress path both Ray Serve's
proxy and Modelplex's router serve; the model id, when there is one, goes in Ray Serve's
``serve_multiplexed_model_id`` header. It runs in the orchestrator's process, never in a
server's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

MODEL_ID_HEADER = "serve_multiplexed_model_id"
JSON = {"Content-Type": "application/json"}


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values`` in ms; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@dataclass
class Point:
    """One measured point: latencies in seconds, counts, wall time."""

    concurrency: int
    seconds: float = 0.0
    ok: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    ttfc: list[float] = field(default_factory=list)  # streams: time to first chunk
    chunks: int = 0  # streams: chunks received
    models: list[str] = field(default_factory=list)  # traces: the model of each completed request

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    def answered(self, failure: str | None, started: float) -> bool:
        """Count one answer: an error of kind ``failure``, or, with none, an answer whose latency
        runs from ``started`` (``time.perf_counter()``); whether it was one."""
        if failure is not None:
            self.error(failure)
            return False
        self.latencies.append(time.perf_counter() - started)
        self.ok += 1
        return True

    def summary(self) -> dict:
        return {
            "concurrency": self.concurrency, "seconds": round(self.seconds, 3), "ok": self.ok,
            "errors": self.errors, "error_kinds": self.error_kinds, "rps": round(self.rps, 2),
            "p50_ms": round(pct(self.latencies, 0.50), 3), "p90_ms": round(pct(self.latencies, 0.90), 3),
            "p99_ms": round(pct(self.latencies, 0.99), 3),
            **({"ttfc_p50_ms": round(pct(self.ttfc, 0.50), 3), "ttfc_p99_ms": round(pct(self.ttfc, 0.99), 3),
                "chunks_per_s": round(self.chunks / self.seconds, 1) if self.seconds else 0.0}
               if self.ttfc else {}),
        }


def _session(timeout_s: float) -> aiohttp.ClientSession:
    # No connection cap: concurrency is set by the number of clients alone.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


async def unary(url: str, body: dict, concurrency: int, seconds: float, *, warmup_s: float = 1.0,
                max_requests: int = 100_000, timeout_s: float = 60.0, headers: dict | None = None) -> Point:
    """``concurrency`` clients, each sending ``body`` again as soon as its answer is in, for
    ``seconds`` (after ``warmup_s`` unmeasured), at most ``max_requests`` answers."""
    data = orjson.dumps(body)
    hdrs = {**JSON, **(headers or {})}
    point = Point(concurrency)
    async with _session(timeout_s) as session:

        async def client(deadline: float, record: bool) -> None:
            while time.perf_counter() < deadline and point.ok < max_requests:
                started = time.perf_counter()
                try:
                    async with session.post(url + "/", data=data, headers=hdrs) as resp:
                        await resp.read()
                        failure = None if resp.status == 200 else f"HTTP {resp.status}"
                except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                    failure = type(error).__name__
                if record:
                    point.answered(failure, started)

        point.seconds = await _warm_then_measure(client, concurrency, warmup_s, seconds)
    return point


async def trace(url: str, models: list[str], body: dict, concurrency: int, *, max_seconds: float,
                timeout_s: float = 60.0) -> Point:
    """Send the trace in order from ``concurrency`` closed-loop clients sharing one cursor
    (request k goes out when a client is free, in trace order); stop at ``max_seconds``."""
    data = orjson.dumps(body)
    point = Point(concurrency)
    cursor = 0
    deadline = time.perf_counter() + max_seconds
    async with _session(timeout_s) as session:

        async def client() -> None:
            nonlocal cursor
            while cursor < len(models) and time.perf_counter() < deadline:
                model = models[cursor]
                cursor += 1
                started = time.perf_counter()
                try:
                    async with session.post(url + "/", data=data, headers={**JSON, MODEL_ID_HEADER: model}) as resp:
                        await resp.read()
                        failure = None if resp.status == 200 else f"HTTP {resp.status}"
                except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                    failure = type(error).__name__
                if point.answered(failure, started):
                    point.models.append(model)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        point.seconds = time.perf_counter() - started
    point.sent = cursor  # type: ignore[attr-defined]
    return point


async def streams(url: str, body: dict, expect_chunks: int, concurrency: int, seconds: float, *,
                  warmup_s: float = 1.0, max_streams: int = 100_000, timeout_s: float = 60.0) -> Point:
    """Closed-loop streaming clients: time to first chunk, whole-stream latency, chunks/s.
    A stream that does not bring ``expect_chunks`` NDJSON lines counts as an error."""
    data = orjson.dumps(body)
    point = Point(concurrency)
    async with _session(timeout_s) as session:

        async def client(deadline: float, record: bool) -> None:
            while time.perf_counter() < deadline and point.ok < max_streams:
                started = time.perf_counter()
                first = None
                lines = 0
                try:
                    async with session.post(url + "/", data=data, headers=JSON) as resp:
                        if resp.status != 200:
                            await resp.read()
                            failure: str | None = f"HTTP {resp.status}"
                        else:
                            async for line in resp.content:
                                if first is None:
                                    first = time.perf_counter() - started
                                if line.strip():
                                    lines += 1
                            failure = None if lines == expect_chunks else f"{lines} chunks"
                except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                    failure = type(error).__name__
                if record and point.answered(failure, started):
                    point.ttfc.append(first)
                    point.chunks += lines

        point.seconds = await _warm_then_measure(client, concurrency, warmup_s, seconds)
    return point


async def with_probe(load, url: str | None, interval_s: float = 0.1, timeout_s: float = 5.0):
    """Await ``load`` (a coroutine returning a :class:`Point`) while a separate client GETs
    ``url`` every ``interval_s``, as a kubelet or a router would poll a replica's health:
    (the point, each answered probe's latency in seconds, the count of failed probes)."""
    if url is None:
        return await load, [], 0
    stop = asyncio.Event()
    latencies: list[float] = []
    failed = 0

    async def probe() -> None:
        nonlocal failed
        async with _session(timeout_s) as session:
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    async with session.get(url) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - started)
                else:
                    failed += 1
                try:
                    await asyncio.wait_for(stop.wait(), interval_s)
                except asyncio.TimeoutError:
                    pass

    task = asyncio.create_task(probe())
    try:
        point = await load
    finally:
        stop.set()
        await task
    return point, latencies, failed


async def paired(url_a: str, url_b: str, body: dict, headers: dict, n: int, *,
                 headers_a: dict | None = None) -> tuple[list[float], list[float]]:
    """Concurrency 1: ``n`` requests to each URL, interleaved A, B, A, B... so both see the
    same background load. URLs are complete (no ``/`` added); ``headers_a`` go to A only."""
    data = orjson.dumps(body)
    hdrs = {**JSON, **headers}
    a: list[float] = []
    b: list[float] = []
    async with _session(30.0) as session:
        for _ in range(n):
            for url, out, extra in ((url_a, a, headers_a or {}), (url_b, b, {})):
                started = time.perf_counter()
                async with session.post(url, data=data, headers={**hdrs, **extra}) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{url}: HTTP {resp.status}")
                out.append(time.perf_counter() - started)
    return a, b


async def unary_grpc(address: str, model: str, row: list[float], concurrency: int, seconds: float, *,
                     warmup_s: float = 1.0, max_requests: int = 100_000, timeout_s: float = 60.0) -> Point:
    """:func:`unary` over the Open Inference Protocol's gRPC ``ModelInfer`` (Modelplex's router at
    ``address``): ``row`` as one FP32 tensor of raw contents, as tritonclient sends it."""
    import grpc
    import numpy as np

    from modelplex_router.grpc import messages

    request = messages.ModelInferRequest(model_name=model)
    request.inputs.add(name="inputs", datatype="FP32", shape=[1, len(row)])
    request.raw_input_contents.append(np.asarray(row, dtype="<f4").tobytes())
    point = Point(concurrency)
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=messages.ModelInferRequest.SerializeToString,
                                    response_deserializer=messages.ModelInferResponse.FromString)

        async def client(deadline: float, record: bool) -> None:
            while time.perf_counter() < deadline and point.ok < max_requests:
                started = time.perf_counter()
                try:
                    await infer(request, timeout=timeout_s)
                except grpc.aio.AioRpcError as error:
                    if record:
                        point.error(f"gRPC {error.code().name}")
                    continue
                if record:
                    point.latencies.append(time.perf_counter() - started)
                    point.ok += 1

        point.seconds = await _warm_then_measure(client, concurrency, warmup_s, seconds)
    return point


async def _warm_then_measure(client, concurrency: int, warmup_s: float, seconds: float) -> float:
    """Run ``concurrency`` clients unrecorded for ``warmup_s``, then recorded for ``seconds``;
    returns the measured wall time."""
    if warmup_s > 0:
        end = time.perf_counter() + warmup_s
        await asyncio.gather(*(client(end, False) for _ in range(concurrency)))
    started = time.perf_counter()
    await asyncio.gather(*(client(started + seconds, True) for _ in range(concurrency)))
    return time.perf_counter() - started
