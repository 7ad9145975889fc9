"""The operator's one client of its pods: every call it makes (a router's load report, a replica's
document, a model load, a pin) reaches a real aiohttp server by a pod IP, an IPv6 one included
(a server bound on ``::1``), with the deployment's credential and never through a proxy."""

from __future__ import annotations

import socket
import time

import pytest
from aiohttp import web
from unit.operator.objects import body, deployment_of

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.load import LOAD_PATH, LoadReport, ReplicaLoad
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.pins import PINS_PATH
from modelplex_operator import builders
from modelplex_operator.config import OperatorConfig
from modelplex_operator.documents import ReplicaDocuments
from modelplex_operator.handlers.autoscale import AutoscaleLoop
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.pods import PodCallError
from modelplex_operator.status import PodView

KEY = ("team-a", "recs")
TOKEN = "team-a-internal-token"


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class Pod:
    """A router's and a replica's endpoints on one address: each request is recorded with the
    credential it carried and whether it came through a proxy (an absolute URL as its target)."""

    def __init__(self):
        self.seen: list[tuple[str, str, str | None]] = []
        self.report = LoadReport("recs", at=time.time(), replicas=(ReplicaLoad("r-1", ongoing=2, models=("m",)),),
                                 model_rates={"m": 1.5})

    def record(self, request: web.Request) -> None:
        self.seen.append((request.method, str(request.rel_url), request.headers.get(INTERNAL_TOKEN_HEADER)))

    async def load(self, request):
        self.record(request)
        return web.Response(body=self.report.to_json(), content_type="application/json")

    async def models(self, request):
        self.record(request)
        return web.json_response(LoadedModels(version=3, models=("m",), model_bytes={"m": 10}).to_dict())

    async def load_model(self, request):
        self.record(request)
        return web.json_response({"model": request.match_info["model"], "loaded": True})

    async def pin(self, request):
        self.record(request)
        sent = await request.json()
        return web.json_response({"pinned": {}, "loaded": sent["models"], "loading": [], "errors": {}})


@pytest.fixture
async def pod_on_ipv6():
    pod = Pod()
    app = web.Application()
    app.router.add_get(LOAD_PATH, pod.load)
    app.router.add_get("/v1/models", pod.models)
    app.router.add_post("/v1/models/{model}/load", pod.load_model)
    app.router.add_post(PINS_PATH, pod.pin)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    pod.port = free_port("::1")
    await web.TCPSite(runner, "::1", pod.port).start()
    try:
        yield pod
    finally:
        await runner.cleanup()


def context() -> OperatorContext:
    ctx = OperatorContext(config=OperatorConfig(), kube=None)
    ctx.credentials.remember(("team-a", "recs"), builders.internal_secret(  # as a reconcile does
        deployment_of(body()), builders.owner_reference(body()), TOKEN))
    return ctx


async def test_every_call_reaches_a_pod_by_its_ipv6_address_with_the_deployments_credential(pod_on_ipv6, monkeypatch):
    # A proxy in the environment is never used: the calls go straight to the pod.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    ctx = context()
    pods, port = ctx.pods, pod_on_ipv6.port
    try:
        assert await pods.load_report(KEY, "::1", port) == pod_on_ipv6.report
        document = await pods.loaded_models(KEY, "::1", port=port)
        assert document.models == ("m",) and document.version == 3
        await pods.load_model(KEY, "::1", "team/model 1", port=port)
        assert await pods.pin(KEY, "::1", ("m",), port=port, timeout_s=5) == {}
        # A pod that does not answer: one error, naming the URL as dialled.
        with pytest.raises(PodCallError, match=r"^http://\[::1\]:\d+/v1/load: "):
            await pods.load_report(KEY, "::1", free_port("::1"), timeout_s=1)
    finally:
        await pods.close()
    assert pod_on_ipv6.seen == [
        ("GET", LOAD_PATH, TOKEN),
        ("GET", "/v1/models", TOKEN),
        ("POST", "/v1/models/team%2Fmodel%201/load", TOKEN),
        ("POST", PINS_PATH, TOKEN),
    ]


async def test_the_autoscaler_and_the_document_reader_reach_ipv6_pods_through_the_one_client(pod_on_ipv6):
    ctx = context()
    doc = body()
    doc["spec"]["router"] = {"replicas": 1, "port": pod_on_ipv6.port}
    loop = AutoscaleLoop(ctx)
    reader = ReplicaDocuments(port=pod_on_ipv6.port, pods=ctx.pods)
    try:
        router = {"metadata": {"name": "recs-router-1"}, "status": {"podIP": "::1"}}
        assert await loop._read_reports(KEY, deployment_of(doc), [router]) == [pod_on_ipv6.report]
        reading = await reader.read(KEY, [PodView("recs-replica-1", ready=True, ip="::1")])
        assert reading.documents["recs-replica-1"].models == ("m",) and reading.unreported == {}
        await reader.close()  # the reader does not close the operator's client
        assert not ctx.pods.session().closed
        session = ctx.pods.session()
    finally:
        await loop.stop()
        await ctx.pods.close()
    assert session.closed  # one session, the operator's, closed at its cleanup
    assert [(method, path) for method, path, _ in pod_on_ipv6.seen] == [("GET", LOAD_PATH), ("GET", "/v1/models")]
    assert {token for _, _, token in pod_on_ipv6.seen} == {TOKEN}

