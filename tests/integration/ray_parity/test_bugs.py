"""The three bugs of the Ray parity issue, each shown on a real replica (bug 1 is in
test_http_streaming.py and tests/unit/test_multiplex.py)."""

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from modelplex import handle
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, internal_token_file

from support.servers import Processes

HERE = Path(__file__).resolve().parent


async def test_bug_2_an_answer_that_cannot_be_sent_says_why_over_http(stack, session):
    async with session.post(stack.url("echo") + "/", json={"unsendable": True}) as response:
        assert response.status == 500
        error = (await response.json())["error"]
    assert error["code"] == "handler_error"
    assert "cannot be sent" in error["message"] and "set" in error["message"]


@pytest.fixture
def processes(tmp_path):
    processes = Processes(tmp_path)
    shutil.copy(HERE / "parity.py", tmp_path / "parity.py")
    try:
        yield processes
    finally:
        processes.stop_all()


def replica_of(processes, handler):
    path = processes.folder / f"{handler.split(':')[1].lower()}.json"
    path.write_text(json.dumps({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                                "metadata": {"name": "bug"}, "spec": {"image": "local", "handler": handler}}))
    return processes.replica(path)


def test_bug_3_a_handler_nothing_can_call_does_not_start(processes):
    """It used to start, report ready, and fail every request."""
    replica = replica_of(processes, "parity:Nothing")
    deadline = time.monotonic() + 60
    while replica.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not replica.alive(), "the replica must refuse to start"
    assert replica.popen.returncode != 0
    assert "nothing can call it" in replica.tail()


async def test_bug_3_a_class_without_dunder_call_names_its_methods_to_plain_requests(processes, session):
    replica = replica_of(processes, "parity:OnlyMethods")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with session.get(replica.url + "/readyz") as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        await asyncio.sleep(0.1)
    # A replica answers only its deployment's own components (the router, with the internal credential).
    internal = {INTERNAL_TOKEN_HEADER: internal_token_file().token()}
    async with session.post(replica.url + "/v1/invoke", json={}, headers=internal) as response:
        assert response.status == 404
        assert "has no __call__" in (await response.json())["error"]["message"]
    assert await handle("bug", url=replica.url).options(path="/v1/invoke") \
        .double.remote(21) == 42
