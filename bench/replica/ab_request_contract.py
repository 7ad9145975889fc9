"""What Ray's HTTP contract (a Starlette ``Request`` per request, ``spec.http.request: starlette``)
costs against the body contract, on the batched handler of Ray's batching tutorial.

    .venv/bin/python bench/replica/ab_request_contract.py [--pairs 5] [--seconds 1.5] [--clients 16]

The same handler class twice, its ``__call__`` written as Ray's tutorial writes it (taking the
``Request``, ``await request.json()``) and as the body contract has it (taking the decoded body),
each behind a real replica app (``create_app``) on loopback, driven by closed-loop aiohttp
clients sending the same JSON body. Runs alternate body, request, request, body, ... so drift
on a shared machine reaches both alike; each pair's ratio is request/body throughput. The
clients share the replicas' process and loop (the same load both ways), so the ratio is of the
whole request path as one process sees it, not of a deployment's replica alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import List

import aiohttp
from aiohttp.test_utils import TestServer
from starlette.requests import Request

from modelplex import serve
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX, METHOD_HEADER, PATH_HEADER
from modelplex.wire.spec import parse_deployment
from modelplex_replica.app import create_app


class Generator:
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def handle_batch(self, inputs: List[str]) -> List[str]:
        return [text.upper() for text in inputs]


class WithRequest(Generator):
    async def __call__(self, request: Request) -> str:
        return await self.handle_batch((await request.json())["text"])


class WithBody(Generator):
    async def __call__(self, body: dict) -> str:
        return await self.handle_batch(body["text"])


def deployment(request: str):
    return parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                             "metadata": {"name": "generator"},
                             "spec": {"image": "x", "handler": "m:H", "maxOngoingRequests": 64,
                                      "http": {"request": request}}})


async def measure(url: str, clients: int, seconds: float) -> tuple[float, float]:
    """Answers per second of ``clients`` closed-loop clients for ``seconds``, and this process's
    CPU time per answer (µs: less moved by other load on a shared machine than the rate)."""
    headers = {METHOD_HEADER: "POST", PATH_HEADER: "/?text=x"}
    done = 0
    async with aiohttp.ClientSession() as session:
        async def client(deadline: float) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(url, json={"text": "hello"}, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                done += 1

        await asyncio.gather(*(client(time.perf_counter() + 0.3) for _ in range(clients)))  # warm-up
        done = 0
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(started + seconds) for _ in range(clients)))
        return done / (time.perf_counter() - started), (time.process_time() - cpu) / done * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    os.environ[ENV_ROUTE_PREFIX] = "/"
    servers = {"body": TestServer(create_app(deployment("body"), WithBody()), host="127.0.0.1"),
               "request": TestServer(create_app(deployment("starlette"), WithRequest()), host="127.0.0.1")}
    for server in servers.values():
        await server.start_server()
    try:
        ratios: dict[str, list[float]] = {"throughput": [], "CPU per request": []}
        order = ["body", "request", "request", "body"]
        for pair in range(args.pairs):
            got = {}
            for kind in order[(pair % 2) * 2:(pair % 2) * 2 + 2]:
                got[kind] = await measure(str(servers[kind].make_url("/v1/invoke")), args.clients, args.seconds)
            ratios["throughput"].append(got["request"][0] / got["body"][0])
            ratios["CPU per request"].append(got["request"][1] / got["body"][1])
            print(f"pair {pair + 1}: body {got['body'][0]:.0f}/s {got['body'][1]:.0f} µs  "
                  f"request {got['request'][0]:.0f}/s {got['request'][1]:.0f} µs  "
                  f"ratios {ratios['throughput'][-1]:.3f} {ratios['CPU per request'][-1]:.3f}")
        for name, values in ratios.items():
            print(f"request/body {name}: median {statistics.median(values):.3f} over {len(values)} pairs "
                  f"(min {min(values):.3f}, max {max(values):.3f})")
    finally:
        for server in servers.values():
            await server.close()


if __name__ == "__main__":
    asyncio.run(main())
