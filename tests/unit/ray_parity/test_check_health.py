"""Ray Serve's ``check_health`` (the production guide's example, the import changed): run on the
deployment's ``health_check_period_s``; a raise or a check that does not answer within
``health_check_timeout_s`` makes the replica not ready, and ``failureThreshold`` in a row fail its
liveness; a check that passes again makes it ready again (issue 40, item 3/4). A real replica
app on loopback, probed as the kubelet probes it."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from modelplex import serve
from modelplex.serve.graph import manifest, walk
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX
from modelplex.wire.spec import parse_deployment
from modelplex_replica.app import create_app
from modelplex_replica.health import Health, check_once


class Connection:
    def __init__(self):
        self.connected = True

    def is_connected(self) -> bool:
        return self.connected


@serve.deployment(health_check_period_s=0.05, health_check_timeout_s=5)
class MyDeployment:
    def __init__(self, db: Connection):
        self._my_db_connection = db

    def __call__(self, request):
        return "cool"

    # Called by Serve to check the replica's health.
    def check_health(self):
        if not self._my_db_connection.is_connected():
            # The specific type of exception is not important.
            raise RuntimeError("uh-oh, DB connection is broken.")


async def probe(client: TestClient, path: str) -> tuple[int, str]:
    async with client.get(path) as response:
        return response.status, await response.text()


async def eventually(client: TestClient, path: str, status: int) -> str:
    """The probe's answer once it is ``status`` (bounded: 30 s, the checks run every 50 ms)."""
    for _ in range(600):
        got, text = await probe(client, path)
        if got == status:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never answered {status}")


async def test_a_failing_check_makes_the_replica_not_ready_then_not_alive_and_a_passing_one_ready_again(
        monkeypatch):
    monkeypatch.setenv(ENV_ROUTE_PREFIX, "/")
    document = manifest(walk(MyDeployment.bind())[0], image="x", handler="m:H")
    document["spec"]["healthCheck"]["failureThreshold"] = 3
    deployment = parse_deployment(document)
    assert (deployment.spec.health_check.period_seconds, deployment.spec.health_check.timeout_seconds) == (0.05, 5)
    db = Connection()
    async with TestClient(TestServer(create_app(deployment, MyDeployment.func_or_class(db)),
                                     host="127.0.0.1")) as client:
        await eventually(client, "/readyz", 200)
        db.connected = False
        assert "uh-oh, DB connection is broken." in await eventually(client, "/readyz", 503)
        assert "3 failed checks in a row" in await eventually(client, "/healthz", 503)
        db.connected = True
        await eventually(client, "/readyz", 200)
        assert await probe(client, "/healthz") == (200, '{"status": "ok"}')


async def test_a_check_that_does_not_answer_in_time_fails():
    async def hangs():
        await asyncio.Event().wait()

    health = Health()
    await check_once(hangs, health, timeout_s=0.01)
    assert (health.failures, health.reason) == (1, "check_health did not answer within 0.01 s")


def test_the_health_check_options_land_in_the_manifest_and_bad_ones_are_refused():
    spec = manifest(walk(MyDeployment.bind())[0], image="x", handler="m:H")["spec"]
    assert spec["healthCheck"] == {"periodSeconds": 0.05, "timeoutSeconds": 5}
    with pytest.raises(ValueError, match="health_check_period_s must be a number of seconds > 0"):
        serve.deployment(health_check_period_s=0)
