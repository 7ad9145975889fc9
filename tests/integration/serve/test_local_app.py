"""``modelplex local app.py:app``: a Ray Serve application run by name, no manifest written by hand."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from support.servers import Processes
from support.stacks import start_local

APP = Path(__file__).resolve().parents[3] / "examples" / "serve" / "composition_app.py:app"


async def test_local_runs_the_graph_and_upstream_reaches_downstream_for_model_bar(processes: Processes):
    stack = start_local(processes, APP, deployments=2)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for _ in range(4):  # both upstream replicas, each with its own handle
            async with session.get(stack.url("upstream") + "/") as response:
                assert (response.status, await response.text()) == (200, "bar")
        async with session.get(stack.url("upstream") + "/v1/replicas") as response:
            assert len((await response.json())["replicas"]) == 2
