"""The autoscaler reads every router's load report at once, each bounded, through the operator's
pod client: real HTTP servers on loopback addresses of their own (one port, as router pods share
theirs), one per kind of router."""

from __future__ import annotations

import asyncio
import socket
import time

from aiohttp import web
from unit.operator.objects import body, deployment_of

from modelplex.wire.load import LOAD_PATH, LoadReport, ReplicaLoad
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers.autoscale import AutoscaleLoop
from modelplex_operator.handlers.context import OperatorContext


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def serve(host: str, port: int, handler) -> web.AppRunner:
    app = web.Application()
    app.router.add_get(LOAD_PATH, handler)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def pod(name: str, ip: str) -> dict:
    return {"metadata": {"name": name}, "status": {"podIP": ip}}


async def test_good_reports_are_read_and_slow_broken_or_absent_routers_are_skipped_in_time():
    hosts = ["127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24"]
    port = free_port(hosts[0])
    report = LoadReport("recs", at=time.time(), queued=3, replicas=(ReplicaLoad("r-1", ongoing=2, models=("m",)),),
                        model_rates={"m": 1.5}, router="good")

    async def good(request):
        return web.Response(body=report.to_json(), content_type="application/json")

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=report.to_json(), content_type="application/json")

    async def failing(request):
        return web.json_response({"error": "boom"}, status=500)

    async def garbage(request):
        return web.Response(text="not a report")

    runners = [await serve(host, port, handler) for host, handler in zip(hosts, (good, slow, failing, garbage))]
    doc = body()
    doc["spec"]["router"] = {"replicas": 2, "port": port}
    ctx = OperatorContext(config=OperatorConfig(), kube=None)
    loop = AutoscaleLoop(ctx, fetch_timeout_s=1.0)
    try:
        started = time.monotonic()
        routers = [pod(f"router-{i}", host) for i, host in enumerate(hosts)] + [pod("router-gone", "127.0.0.25")]
        reports = await loop._read_reports(("team-a", "recs"), deployment_of(doc), routers)
        elapsed = time.monotonic() - started
    finally:
        await loop.stop()
        await ctx.pods.close()
        for runner in runners:
            await runner.cleanup()
    assert reports == [report]
    assert elapsed < 1.0 + 2.0  # all at once, each bounded by the timeout (+ generous slack)
