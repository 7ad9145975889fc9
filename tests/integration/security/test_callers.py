"""Credentials per deployment in local mode (real processes): one deployment's user code cannot
use another's internal API (its router's method calls, its replicas) unless that one lists it as
a caller (``spec.router.callers``), and then only within its globs and its load quota, as the
client named after it. A label or a shared namespace grants nothing; no token reaches a log."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import aiohttp
import pytest

from support.servers import Processes
from support.stacks import Stack, manifest, start_local, write_documents

HERE = Path(__file__).resolve().parent
MODEL = "serve_multiplexed_model_id"
CLIENTS = {"alice": "alice-token-0123456789"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request) -> Stack:
    """``scorer`` lists ``front`` as a caller, globs it to ``public-*`` and gives it one cold load
    per long while; ``stranger`` (the same code as ``front``, same namespace, same labels) is not listed."""
    processes = Processes(tmp_path_factory.mktemp("callers"))
    for handlers in ("handlers.py", "caller_handlers.py"):
        shutil.copy(HERE / handlers, processes.folder / handlers)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "scorer-clients"}, "stringData": CLIENTS}
    scorer = manifest("scorer", "handlers:Greeter", router={
        "auth": {"secretRef": {"name": "scorer-clients"}, "models": {"front": ["public-*"]}},
        "loadQuota": {"loadsPerMinute": 0.01, "burst": 1}, "callers": ["front"]})
    callers = [manifest(name, "caller_handlers:Front", env=[{"name": "TARGET", "value": "scorer"}])
               for name in ("front", "stranger")]
    for document in callers:
        document["metadata"]["labels"] = {"modelplex.io/app": "shop"}  # a label alone grants nothing
    path = write_documents(processes.folder / "callers.yaml", [secret, scorer, *callers])
    request.addfinalizer(processes.stop_all)  # (start_local's own error names the run's output)
    return start_local(processes, path, deployments=3)


async def ask(session: aiohttp.ClientSession, stack: Stack, deployment: str, model: str, **request) -> dict:
    """Have ``deployment``'s user code try ``request`` against the scorer; what it got."""
    async with session.post(stack.url(deployment) + "/", json=request, headers={MODEL: model}) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def deployment_token(stack: Stack, name: str) -> str:
    (folder,) = re.findall(r"^deployment credentials: (\S+)/<name>", stack.proc.log.read_text(), flags=re.M)
    return (Path(folder) / name).read_text().strip()


async def scorer_replica(session: aiohttp.ClientSession, stack: Stack) -> str:
    token = deployment_token(stack, "scorer")
    async with session.get(stack.url("scorer") + "/v1/replicas", headers={"X-Modelplex-Internal-Token": token}) as r:
        assert r.status == 200
        (replica,) = (await r.json())["replicas"]
    return replica["url"]


async def test_an_unlisted_deployment_s_code_reaches_nothing_of_another_s_internal_api(stack):
    async with aiohttp.ClientSession() as session:
        for what in ({}, {"do": "method", "greeting": "pwned"}):
            got = await ask(session, stack, "stranger", "public-1", **what)
            assert got["status"] == 403, got
        got = await ask(session, stack, "stranger", "public-1", do="replica", url=await scorer_replica(session, stack))
        assert got["status"] == 401  # its own credential opens nothing of the scorer's replicas
        # The greeting is untouched: asked by alice, a client of the scorer.
        async with session.post(stack.url("scorer") + "/", json={}, headers={
                MODEL: "private-9", "Authorization": f"Bearer {CLIENTS['alice']}"}) as response:
            assert response.status == 200 and (await response.json())["greeting"] == "hello"


async def test_a_listed_caller_s_code_is_held_to_its_globs_and_its_quota_and_never_reaches_a_replica(stack):
    async with aiohttp.ClientSession() as session:
        got = await ask(session, stack, "front", "public-1")
        assert got["status"] == 200 and got["answer"]["score"] == 16.0, got
        got = await ask(session, stack, "front", "public-1", do="method", greeting="hi from front")
        assert got == {"status": 200, "answer": "hi from front"}  # a method call: what handles do
        got = await ask(session, stack, "front", "private-1")
        assert got["status"] == 403 and "'front'" in got["error"] and "private-1" in got["error"], got
        # Its one cold load is spent (public-1): another model it may call is a 429, and not loaded.
        got = await ask(session, stack, "front", "public-2")
        assert got["status"] == 429, got
        got = await ask(session, stack, "front", "public-1", do="replica", url=await scorer_replica(session, stack))
        assert got["status"] == 401  # the scorer's replicas answer the scorer's components only
    log = stack.proc.log.read_text()
    tokens = [deployment_token(stack, name) for name in ("front", "stranger", "scorer")] + list(CLIENTS.values())
    assert not any(token in log for token in tokens)
