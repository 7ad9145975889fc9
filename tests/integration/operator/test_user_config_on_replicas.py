"""``spec.userConfig`` changed on live replicas, as Ray's ``reconfigure``: the operator's sender
(:class:`~modelplex_operator.user_config.UserConfigs` over its one client of the pods) against
real replica apps on loopback, each with the deployment's credential and a handler written as
a Ray user writes one (an async ``reconfigure`` that sets what ``__call__`` answers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from modelplex.processes import free_port
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, TokenFile, write_token_file
from modelplex.wire.spec import Deployment, parse_deployment
from modelplex.wire.user_config import config_hash
from modelplex_operator.pods import PodClient
from modelplex_operator.status import PodView
from modelplex_operator.user_config import CONDITION, RETRY_S, UserConfigs
from modelplex_replica.app import create_app

KEY = ("team-a", "greeter")
TOKEN = "greeter-internal-token"
HELLO = {"greeting": "hello", "punctuation": "!"}


class Greeter:
    """A deployment whose answer its user_config sets."""

    def __init__(self, config: dict):
        self.greeting = config["greeting"]  # as the replica's build applied spec.userConfig
        self.reconfigured = 0

    async def reconfigure(self, config: dict) -> None:
        if config.get("greeting") == "":
            raise ValueError("the greeting must not be empty")
        await asyncio.sleep(0)  # an async reconfigure, as Ray allows
        self.greeting = config["greeting"]
        self.reconfigured += 1

    async def __call__(self, body: dict) -> dict:
        return {"text": f"{self.greeting}, {body['name']}"}


def deployment(user_config: dict) -> Deployment:
    return parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                             "metadata": {"name": "greeter", "namespace": "team-a"},
                             "spec": {"image": "img", "handler": "greeter:Greeter", "userConfig": user_config}})


class Replicas:
    """Replica apps on 127.0.0.1, 127.0.0.2, ... all on one port (as pods on their own IPs)."""

    def __init__(self, tmp_path: Path):
        self.port = free_port()
        self.internal = TokenFile(write_token_file(tmp_path / "internal", TOKEN))
        self.servers: dict[str, TestServer] = {}
        self.handlers: dict[str, Greeter] = {}

    async def start(self, name: str, ip: str) -> PodView:
        handler = self.handlers[name] = Greeter(HELLO)
        server = self.servers[name] = TestServer(create_app(deployment(HELLO), handler, internal=self.internal),
                                                 host=ip, port=self.port)
        await server.start_server()
        return PodView(name=name, ready=True, ip=ip)

    async def ask(self, name: str) -> str:
        server = self.servers[name]
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://{server.host}:{self.port}/v1/invoke", json={"name": "Ada"},
                                    headers={INTERNAL_TOKEN_HEADER: TOKEN}) as answer:
                assert answer.status == 200, await answer.text()
                return (await answer.json())["text"]

    async def close(self) -> None:
        for server in self.servers.values():
            await server.close()


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    started = Replicas(tmp_path)
    try:
        yield started
    finally:
        await started.close()


@pytest.fixture
async def client() -> AsyncIterator[PodClient]:
    pods = PodClient(credential=lambda key: TOKEN if key == KEY else None)
    try:
        yield pods
    finally:
        await pods.close()


async def test_a_new_user_config_reaches_each_live_replicas_reconfigure_once_and_the_status_names_it(
        replicas, client):
    pods = [await replicas.start("greeter-a", "127.0.0.1"), await replicas.start("greeter-b", "127.0.0.2")]
    configs = UserConfigs(client, port=replicas.port)
    # Replicas that started with the spec's value answer for it without calling reconfigure again.
    started = await configs.sync(KEY, HELLO, pods)
    assert started.condition is not None and started.condition["status"] == "True"
    assert started.events == [] and [h.reconfigured for h in replicas.handlers.values()] == [0, 0]
    bonjour = {"greeting": "bonjour", "punctuation": "!"}
    changed = await configs.sync(KEY, bonjour, pods, generation=2)
    assert [h.reconfigured for h in replicas.handlers.values()] == [1, 1]
    assert [await replicas.ask(name) for name in replicas.servers] == ["bonjour, Ada", "bonjour, Ada"]
    assert changed.status == {"hash": config_hash(bonjour), "applied": 2, "replicas": [
        {"name": "greeter-a", "hash": config_hash(bonjour)}, {"name": "greeter-b", "hash": config_hash(bonjour)}]}
    assert changed.condition is not None
    assert (changed.condition["type"], changed.condition["status"], changed.condition["reason"]) == \
        (CONDITION, "True", "Applied")
    assert changed.condition["observedGeneration"] == 2
    assert [(kind, reason) for kind, reason, _ in changed.events] == [("Normal", "UserConfigApplied")]
    # Nothing new: no request reaches a replica's reconfigure, no Event.
    again = await configs.sync(KEY, bonjour, pods, generation=2)
    assert again.events == [] and [h.reconfigured for h in replicas.handlers.values()] == [1, 1]
    # A pod that went unready (its container may have restarted) is sent the value again once ready.
    await configs.sync(KEY, bonjour, [PodView(name="greeter-a", ready=False, ip="127.0.0.1"), pods[1]])
    back = await configs.sync(KEY, bonjour, pods)
    assert back.status is not None and back.status["applied"] == 2 and back.events == []
    assert [h.reconfigured for h in replicas.handlers.values()] == [1, 1]


async def test_a_reconfigure_that_raises_is_reported_once_and_the_replica_serves_on_with_the_value_it_had(
        replicas, client):
    pods = [await replicas.start("greeter-a", "127.0.0.1")]
    configs = UserConfigs(client, port=replicas.port)
    failed = await configs.sync(KEY, {"greeting": ""}, pods)
    assert failed.condition is not None and failed.condition["status"] == "False"
    assert failed.condition["reason"] == "ReconfigureFailed"
    assert "greeter-a: HTTP 500: ValueError: the greeting must not be empty" in failed.condition["message"]
    [(kind, reason, message)] = failed.events
    assert (kind, reason) == ("Warning", "ReconfigureFailed") and "greeter-a" in message
    assert failed.retry_in is None  # asking again would fail again
    assert await replicas.ask("greeter-a") == "hello, Ada"
    # Not sent again (no crash loop, no second Event) until the value changes.
    assert (await configs.sync(KEY, {"greeting": ""}, pods)).events == []
    fixed = await configs.sync(KEY, {"greeting": "hi"}, pods)
    assert fixed.condition is not None and fixed.condition["status"] == "True"
    assert await replicas.ask("greeter-a") == "hi, Ada"


async def test_a_replica_refuses_a_user_config_without_the_deployments_credential(replicas):
    pods = [await replicas.start("greeter-a", "127.0.0.1")]
    stranger = PodClient(credential=lambda key: "not-the-token")
    try:
        result = await UserConfigs(stranger, port=replicas.port).sync(KEY, {"greeting": "pwned"}, pods)
    finally:
        await stranger.close()
    assert result.condition is not None and result.condition["reason"] == "ReplicaUnreachable"
    assert "HTTP 401" in result.condition["message"] and "not-the-token" not in result.condition["message"]
    assert replicas.handlers["greeter-a"].reconfigured == 0 and await replicas.ask("greeter-a") == "hello, Ada"


async def test_a_replica_that_did_not_answer_is_asked_again_after_a_pause(replicas, client):
    now = [100.0]
    configs = UserConfigs(client, port=replicas.port, clock=lambda: now[0], timeout_s=5)
    late = PodView(name="greeter-a", ready=True, ip="127.0.0.1")  # nothing listens there yet
    first = await configs.sync(KEY, {"greeting": "hey"}, [late])
    assert first.condition is not None and first.condition["reason"] == "ReplicaUnreachable"
    assert first.retry_in == RETRY_S
    await replicas.start("greeter-a", "127.0.0.1")
    now[0] += RETRY_S / 2
    assert (await configs.sync(KEY, {"greeting": "hey"}, [late])).retry_in == RETRY_S / 2  # not yet
    assert replicas.handlers["greeter-a"].reconfigured == 0
    now[0] += RETRY_S / 2
    applied = await configs.sync(KEY, {"greeting": "hey"}, [late])
    assert applied.condition is not None and applied.condition["status"] == "True" and applied.retry_in is None
    assert await replicas.ask("greeter-a") == "hey, Ada"
