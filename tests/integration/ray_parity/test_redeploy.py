"""Redeploying releases a replica's models, as Ray's test_replica_upgrade_to_cleanup_resource
checks it: ``serve.run`` of the application again replaces its replica, and the old replica's
loaded models are let go (their ``__del__`` runs). Ray's recorder deployment is a file here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import aiohttp
import cloudpickle

from modelplex import serve
from modelplex.wire.names import MODEL_ID_HEADER

from support.stacks import consecutive_free_ports

# Shipped to the replicas by value, as a script's classes are (tests/ is not on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Weights:
    """A loaded model that notes its release in the record file."""

    def __init__(self, model_id: str, record: str):
        self.model_id = model_id
        self.record = record

    def __del__(self):
        with open(self.record, "a") as record:
            record.write(self.model_id + "\n")


@serve.deployment(num_replicas=1)
class Model:
    def __init__(self, record: str):
        self.record = record

    @serve.multiplexed(max_num_models_per_replica=1)
    async def get_model(self, tag: str) -> Weights:
        return Weights(tag, self.record)

    async def __call__(self, body):
        await self.get_model(serve.get_multiplexed_model_id())
        return os.getpid()


def released(record: Path) -> list[str]:
    return record.read_text().split() if record.exists() else []


async def test_running_the_application_again_releases_the_old_replicas_models(tmp_path):
    record = tmp_path / "released"
    port = consecutive_free_ports(1)
    url = f"http://127.0.0.1:{port}/"
    try:
        serve.run(Model.bind(str(record)), _port=port)
        # No kept-alive connection: the router answering after the second run is a new process.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                         connector=aiohttp.TCPConnector(force_close=True)) as session:
            async with session.post(url, json={}, headers={MODEL_ID_HEADER: "1"}) as response:
                assert response.status == 200, await response.text()
                old_pid = await response.json()
            assert released(record) == []

            serve.run(Model.bind(str(record)), _port=port)
            assert released(record) == ["1"]
            async with session.post(url, json={}, headers={MODEL_ID_HEADER: "1"}) as response:
                assert response.status == 200 and await response.json() != old_pid  # a new replica
    finally:
        serve.shutdown()


@serve.deployment(num_replicas=2, user_config={"threshold": 0.5})
class Thresholded:
    """Ray's user_config example: reconfigure is called with it at start and on every update."""

    def __init__(self):
        self.threshold = 0.0
        self.reconfigured = 0

    def reconfigure(self, config: dict):
        self.threshold = config["threshold"]
        self.reconfigured += 1

    def state(self) -> list:
        return [os.getpid(), self.threshold, self.reconfigured]


async def answers(handle, count: int = 12) -> set[tuple]:
    return {tuple(await handle.state.remote()) for _ in range(count)}


async def test_a_change_of_user_config_alone_reconfigures_the_live_replicas_without_a_restart():
    """Issue 40, item 6: it restarted the replicas; Ray calls reconfigure on the live ones."""
    port = consecutive_free_ports(1)
    try:
        handle = serve.run(Thresholded.bind(), _port=port)
        before = await answers(handle)
        assert {(threshold, count) for _, threshold, count in before} == {(0.5, 1)}
        handle = serve.run(Thresholded.options(user_config={"threshold": 0.9}).bind(), _port=port)
        after = await answers(handle)
        # The same processes, each reconfigured once more: all answers see the new threshold.
        assert {pid for pid, _, _ in after} <= {pid for pid, _, _ in before}
        assert {(threshold, count) for _, threshold, count in after} == {(0.9, 2)}
    finally:
        serve.shutdown()
