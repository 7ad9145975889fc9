"""The trust boundary in local mode: what an external client may do at a router, and that a
replica answers only the deployment's own components (README, "Security")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest

from modelplex.wire.codec import CALL_CONTENT_TYPE

from support.servers import MODELPLEX, Processes
from support.stacks import Stack, manifest, start_local, write_documents

HERE = Path(__file__).resolve().parent
MODEL = "serve_multiplexed_model_id"
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    """Two deployments of one manifest: ``open`` with today's defaults, ``guarded`` with router
    auth from a Secret document in the same file (as ``kubectl apply -f`` takes it)."""
    processes = Processes(tmp_path_factory.mktemp("trust"))
    shutil.copy(HERE / "handlers.py", processes.folder / "handlers.py")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "greeter-clients"},
              "stringData": TOKENS}
    guarded = manifest("guarded", "handlers:Greeter", router={
        "auth": {"secretRef": {"name": "greeter-clients"}, "models": {"bob": ["public-*"]}}})
    path = write_documents(processes.folder / "trust.yaml",
                           [manifest("open", "handlers:Greeter"), secret, guarded])
    try:
        yield start_local(processes, path, deployments=2)
    except BaseException:
        print(processes.report())
        raise
    finally:
        processes.stop_all()


def internal_token(stack: Stack) -> str:
    """The run's internal credential, from the file ``modelplex local`` names."""
    (path,) = re.findall(r"^internal credential: (\S+)", stack.proc.log.read_text(), flags=re.M)
    return Path(path).read_text().strip()


def deployment_token(stack: Stack, name: str) -> str:
    """A deployment's own internal credential (its replicas answer nobody else), from the
    folder ``modelplex local`` names."""
    (folder,) = re.findall(r"^deployment credentials: (\S+)/<name>", stack.proc.log.read_text(), flags=re.M)
    return (Path(folder) / name).read_text().strip()


async def replicas_of(session: aiohttp.ClientSession, router: str, token: str | None = None) -> list[dict]:
    headers = {"X-Modelplex-Internal-Token": token} if token else None
    async with session.get(router + "/v1/replicas", headers=headers) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["replicas"]


async def test_unload_through_the_router_is_forbidden_by_default_and_the_model_stays_loaded(stack):
    router = stack.url("open")
    async with aiohttp.ClientSession() as session:
        async with session.post(router + "/", json={}, headers={MODEL: "m1"}) as response:
            assert response.status == 200 and (await response.json())["score"] == 4.0
        for action in ("unload", "load"):
            async with session.post(router + f"/v2/repository/models/m1/{action}") as response:
                assert response.status == 403
                assert "spec.router.modelControl" in (await response.json())["error"]
        (replica,) = await replicas_of(session, router)
        assert "m1" in replica["models"]


async def test_an_external_method_call_is_forbidden_whatever_it_sends_and_changes_nothing(stack):
    router = stack.url("open")
    call = json.dumps({"method": "set_greeting", "args": ["pwned"], "kwargs": {}})
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"X-Modelplex-Internal-Token": "a guess"}, {"Authorization": "Bearer a guess"}):
            async with session.post(router + "/", data=call, headers={
                    "Content-Type": CALL_CONTENT_TYPE, MODEL: "m1", **headers}) as response:
                assert response.status == 403
                assert (await response.json())["error"]["code"] == "forbidden"
        async with session.post(router + "/", json={}, headers={MODEL: "m1"}) as response:
            assert (await response.json())["greeting"] == "hello"


async def test_a_replica_answers_its_internal_api_only_to_holders_of_the_credential(stack):
    token = deployment_token(stack, "open")
    async with aiohttp.ClientSession() as session:
        (replica,) = await replicas_of(session, stack.url("open"))
        url = replica["url"]
        async with session.get(url + "/v1/models") as response:
            assert response.status == 401
            assert "X-Modelplex-Internal-Token" in (await response.json())["error"]["message"]
        async with session.post(url + "/v1/invoke", json={}, headers={MODEL: "m2"}) as response:
            assert response.status == 401
        async with session.delete(url + "/v1/models/m1", headers={"X-Modelplex-Internal-Token": "wrong"}) as response:
            assert response.status == 401
        async with session.get(url + "/v1/models", headers={"X-Modelplex-Internal-Token": token}) as response:
            assert response.status == 200 and "m2" not in (await response.json())["models"]
        # Not another deployment's, nor the run's (which the routers take, for scripts' handles).
        for other in (deployment_token(stack, "guarded"), internal_token(stack)):
            async with session.get(url + "/v1/models", headers={"X-Modelplex-Internal-Token": other}) as response:
                assert response.status == 401
        for probe in ("/healthz", "/readyz"):
            async with session.get(url + probe) as response:
                assert response.status == 200


async def test_with_router_auth_a_client_needs_its_token_and_stays_within_its_models(stack):
    router = stack.url("guarded")
    async with aiohttp.ClientSession() as session:
        async with session.post(router + "/", json={}, headers={MODEL: "public-1"}) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await response.json())["error"]["code"] == "unauthorized"
        async with session.post(router + "/", json={}, headers={
                MODEL: "public-1", "Authorization": "Bearer not-a-token"}) as response:
            assert response.status == 401
        alice = {"Authorization": f"Bearer {TOKENS['alice']}"}
        bob = {"Authorization": f"Bearer {TOKENS['bob']}"}
        async with session.post(router + "/", json={}, headers={MODEL: "private-1", **alice}) as response:
            assert response.status == 200
            assert "X-Modelplex-Replica" not in response.headers  # routing detail, not for clients
        async with session.post(router + "/", json={}, headers={MODEL: "public-1", **bob}) as response:
            assert response.status == 200
        async with session.post(router + "/", json={}, headers={MODEL: "private-2", **bob}) as response:
            assert response.status == 403
            message = (await response.json())["error"]["message"]
            assert "'bob'" in message and "'private-2'" in message
        async with session.get(router + "/v1/replicas", headers=alice) as response:
            assert response.status == 403  # routing internals: for the deployment's components
        for probe in ("/healthz", "/readyz"):
            async with session.get(router + probe) as response:
                assert response.status == 200
        async with session.get(stack.control_url("guarded") + "/metrics") as response:
            assert response.status == 200  # the control port: open to whoever the network lets in
        (replica,) = await replicas_of(session, router, internal_token(stack))
        assert "private-2" not in replica["models"] and "private-1" in replica["models"]
        # No token reaches the metrics.
        async with session.get(stack.control_url("guarded") + "/metrics") as response:
            page = await response.text()
        assert not any(token in page for token in TOKENS.values())
    log = stack.proc.log.read_text()
    assert not any(token in log for token in TOKENS.values()) and internal_token(stack) not in log


def test_a_replica_without_a_credential_refuses_to_listen_beyond_loopback(tmp_path):
    shutil.copy(HERE / "handlers.py", tmp_path / "handlers.py")
    path = write_documents(tmp_path / "bare.yaml", [manifest("bare", "handlers:Greeter")])
    done = subprocess.run([*MODELPLEX, "replica", "--spec", str(path), "--host", "0.0.0.0", "--port", "1"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "MODELPLEX_INTERNAL_TOKEN_FILE" in done.stderr


def test_a_replica_whose_credential_cannot_be_read_refuses_to_start_naming_the_file(tmp_path):
    shutil.copy(HERE / "handlers.py", tmp_path / "handlers.py")
    path = write_documents(tmp_path / "bare.yaml", [manifest("bare", "handlers:Greeter")])
    missing = tmp_path / "no-such-token"
    done = subprocess.run([*MODELPLEX, "replica", "--spec", str(path), "--host", "127.0.0.1", "--port", "1"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "MODELPLEX_INTERNAL_TOKEN_FILE": str(missing)})
    assert done.returncode == 2
    assert str(missing) in done.stderr and "unreadable" in done.stderr
