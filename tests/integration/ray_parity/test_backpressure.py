"""Ray's ``max_queued_requests`` (``python/ray/serve/tests/test_backpressure.py``): a deployment
with ``max_ongoing_requests=1, max_queued_requests=1`` serves one request, queues a second, and
refuses a third at once: ``BackPressureError`` through a handle, a 503 with Ray's wording over
HTTP; the two admitted ones finish once the signal comes. Ray's signal actor is a flag file here
and its ``cur_num_waiters`` a file the handler writes on entry; the queued request is read from
the router's table (``/v1/replicas``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import cloudpickle
import pytest
from starlette.requests import Request

from modelplex import serve
from modelplex.serve.exceptions import BackPressureError
from modelplex.serve.running import script_credential
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.names import router_env_name

from support.stacks import consecutive_free_ports

# Shipped to the replicas by value, as a script's classes are (tests/ is not on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

WAIT_S = 60


async def signal(flag: str, started: str, msg: str) -> str:
    """Ray's ``await signal_actor.wait.remote()``: note the arrival, wait for the flag file."""
    with open(started, "a") as record:
        record.write(msg + "\n")
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(flag) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return msg


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1)
class Deployment:
    def __init__(self, flag: str, started: str):
        self.flag, self.started = flag, started

    async def __call__(self, msg: str) -> str:
        return await signal(self.flag, self.started, msg)


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1)
class HTTPDeployment:
    def __init__(self, flag: str, started: str):
        self.flag, self.started = flag, started

    async def __call__(self, request: Request) -> str:
        return await signal(self.flag, self.started, (await request.json())["msg"])


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


def arrived(started: Path) -> list[str]:
    return started.read_text().split() if started.exists() else []


def queued(deployment: str) -> int:
    """Requests waiting in the deployment's router now (its table, as ``serve.status`` reads it)."""
    url = os.environ[router_env_name(deployment)] + "/v1/replicas"
    request = urllib.request.Request(url, headers={INTERNAL_TOKEN_HEADER: script_credential().token() or ""})
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
        return json.load(answer)["queued"]


async def test_a_handle_call_past_max_queued_requests_raises_back_pressure_error(tmp_path):
    flag, started = tmp_path / "signal", tmp_path / "started"
    try:
        handle = serve.run(Deployment.bind(str(flag), str(started)), _port=consecutive_free_ports(1))

        async def call(msg: str) -> str:
            return await handle.remote(msg)

        # First request should be processed.
        first = asyncio.create_task(call("hi-1"))
        await until(lambda: arrived(started) == ["hi-1"], "the first request at the replica")
        # Second request should be queued.
        second = asyncio.create_task(call("hi-2"))
        await until(lambda: queued("deployment") == 1, "the second request queued in the router")
        # Third request should be rejected.
        with pytest.raises(BackPressureError, match=r"Request dropped due to backpressure "
                                                    r"\(num_queued_requests=1, max_queued_requests=1\)"):
            await handle.remote("hi-3")
        flag.touch()
        assert await asyncio.wait_for(first, WAIT_S) == "hi-1"
        assert await asyncio.wait_for(second, WAIT_S) == "hi-2"
        assert arrived(started) == ["hi-1", "hi-2"]
    finally:
        serve.shutdown()


async def test_an_http_request_past_max_queued_requests_is_a_503_with_rays_message(tmp_path):
    flag, started = tmp_path / "signal", tmp_path / "started"
    port = consecutive_free_ports(1)
    try:
        serve.run(HTTPDeployment.bind(str(flag), str(started)), _port=port)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:

            async def do_request(msg: str) -> tuple[int, str]:
                async with session.post(f"http://127.0.0.1:{port}/", json={"msg": msg}) as response:
                    return response.status, await response.text()

            first = asyncio.create_task(do_request("hi-1"))
            await until(lambda: arrived(started) == ["hi-1"], "the first request at the replica")
            second = asyncio.create_task(do_request("hi-2"))
            await until(lambda: queued("http-deployment") == 1, "the second request queued in the router")
            status, text = await do_request("hi-3")
            assert status == 503
            assert "Request dropped due to backpressure (num_queued_requests=1, max_queued_requests=1)." in text
            flag.touch()
            assert await asyncio.wait_for(first, WAIT_S) == (200, "hi-1")
            assert await asyncio.wait_for(second, WAIT_S) == (200, "hi-2")
    finally:
        serve.shutdown()
