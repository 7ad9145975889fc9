"""Ray's ``logging_config`` reaches the components' logs: ``serve.run(app, logging_config=...)``
(the application's, for each deployment without its own, as in Ray) with ``log_level: DEBUG``
and ``encoding: JSON`` makes the replica's and the router's own lines JSON objects, a debug line
of the user's code among them, and ``enable_access_log`` the router's access line for each
request. The processes write to this test's stderr (``capfd``)."""

from __future__ import annotations

import json
import logging
import sys

import aiohttp
import cloudpickle

from modelplex import serve
from modelplex.serve.schema import LoggingConfig

from support.stacks import consecutive_free_ports

# Shipped to the replicas by value, as a script's classes are (tests/ is not on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

logger = logging.getLogger("ray.serve")


@serve.deployment
class Logged:
    def __call__(self) -> str:
        logger.debug("handled in the replica")
        return "Hello world!"


def json_lines(text: str) -> list[dict]:
    lines = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    return lines


async def test_the_applications_logging_config_makes_the_components_log_json_at_its_level(capfd):
    port = consecutive_free_ports(1)
    try:
        serve.run(Logged.bind(), _port=port,
                  logging_config=LoggingConfig(log_level="DEBUG", encoding="JSON", enable_access_log=True))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                assert (response.status, await response.text()) == (200, "Hello world!")
    finally:
        serve.shutdown()
    records = json_lines(capfd.readouterr().err)
    mine = [r for r in records if r.get("message") == "handled in the replica"]
    assert mine and mine[0]["levelname"] == "DEBUG" and mine[0]["name"] == "ray.serve"
    # The components' own lines too: the replica's and the router's, from the serving module.
    assert {r["message"].split(":")[0] for r in records if r.get("name") == "modelplex.serving"} >= {
        "replica of 'logged'", "router of 'logged'"}
    access = [json.loads(r["message"]) for r in records if r.get("name") == "modelplex.access"]
    assert [(line["method"], line["status"]) for line in access if line["path"] == "/"] == [("GET", 200)]


async def test_without_logging_config_the_lines_stay_text_and_debug_stays_out(capfd):
    port = consecutive_free_ports(1)
    try:
        serve.run(Logged.bind(), _port=port)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                assert response.status == 200
    finally:
        serve.shutdown()
    err = capfd.readouterr().err
    assert "handled in the replica" not in err
    assert " INFO modelplex.serving: replica of 'logged'" in err
    assert not [r for r in json_lines(err) if "levelname" in r]
