"""The router's HTTP edges, one test each, on real processes: header spellings, missing model
ids, unknown paths, wrong methods, GET calls, and server-sent events through proxies and to
``EventSource``."""

from __future__ import annotations

import json

import aiohttp
import numpy as np

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import metric_value

TIMEOUT = aiohttp.ClientTimeout(total=60)
ROW = list(np.linspace(0, 1, 16).round(3))


async def load_failures(session: aiohttp.ClientSession, replica_url: str) -> float:
    async with session.get(replica_url + "/metrics") as resp:
        return metric_value(await resp.text(), "modelplex_model_load_failures_total")


async def test_the_dashed_model_id_header_that_proxies_keep_is_accepted(zoo):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        answers = []
        for header in (MODEL_ID_HEADER, "Serve-Multiplexed-Model-Id"):
            async with session.post(zoo.router_url + "/", json={"inputs": ROW}, headers={header: "mlp-a"}) as resp:
                assert resp.status == 200, await resp.text()
                answers.append((await resp.json())["outputs"])
        assert answers[0] == answers[1]


async def test_a_missing_model_id_on_a_multi_model_deployment_is_a_400(zoo):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        failures = await load_failures(session, zoo.replica_url)
        async with session.post(zoo.router_url + "/", json={"inputs": ROW}) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["code"] == "bad_request"
            # Ray's message, and where the id goes.
            assert error["message"] == "The model ID cannot be empty." and MODEL_ID_HEADER in error["hint"], error
        # The replica tried no load of model '': nothing failed there.
        assert await load_failures(session, zoo.replica_url) == failures


async def test_a_deployment_without_models_needs_no_model_id(stack):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(stack["tensors"].router_url + "/", json={"inputs": [1, 2]}) as resp:
            assert resp.status == 200
            assert (await resp.json()) == {"outputs": [2.0, 4.0]}


async def test_unknown_oip_paths_are_404_with_an_oip_error(zoo):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for path in ("/v2/nope", "/v2/models/mlp-a/explain", "/v2/models/mlp-a/versions/1/nothing"):
            async with session.get(zoo.router_url + path) as resp:
                assert resp.status == 404, path
                body = await resp.json()
                assert isinstance(body["error"], str) and path in body["error"]


async def test_wrong_methods_on_the_routers_own_paths_are_405_with_allow(zoo):
    cases = {
        ("POST", "/healthz"): {"GET", "HEAD"},
        ("POST", "/v1/replicas"): {"GET", "HEAD"},
        ("DELETE", "/readyz"): {"GET", "HEAD"},  # (/metrics is the control port's: here, the handler's)
        ("DELETE", "/v1/models/mlp-a/predict"): {"GET", "HEAD", "POST"},
        ("GET", "/v2/models/mlp-a/infer"): {"POST"},
        ("POST", "/v2/health/ready"): {"GET", "HEAD"},
        ("GET", "/v2/repository/index"): {"POST"},
    }
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        failures = await load_failures(session, zoo.replica_url)
        for (method, path), allowed in cases.items():
            async with session.request(method, zoo.router_url + path, headers={MODEL_ID_HEADER: "mlp-a"}) as resp:
                assert resp.status == 405, (method, path)
                assert set(resp.headers["Allow"].replace(" ", "").split(",")) == allowed, (method, path)
                body = await resp.json()
                assert "error" in body
        # The replica was asked for nothing: it never tried to load model ''.
        assert await load_failures(session, zoo.replica_url) == failures


async def test_a_get_reaches_the_handler_as_in_rays_docs(stack):
    url = stack["hello"].router_url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for path in ("/", "/some/sub/path"):
            async with session.get(url + path) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json()) == {"hello": "world", "body_bytes": 0}


async def test_server_sent_events_carry_anti_buffering_headers_and_stream_to_a_get(stack):
    url = stack["events"].router_url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        # What a browser's EventSource sends: a GET, Accept: text/event-stream, no body.
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        async with session.get(url + "/", headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            assert resp.headers["Cache-Control"] == "no-cache"
            assert resp.headers["X-Accel-Buffering"] == "no"
            text = await resp.text()
        events = [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: ")]
        assert events == [{"step": 0, "total": 0}, {"step": 1, "total": 1}, {"step": 2, "total": 5}]
        # An NDJSON stream is not an event stream: no such headers there.
        async with session.post(url + "/", json={}) as resp:
            assert resp.headers["Content-Type"].startswith("application/x-ndjson")
            assert "X-Accel-Buffering" not in resp.headers
            await resp.read()


ONE_SHOT = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}


async def test_a_generator_handler_through_one_shot_infer_is_a_400_before_it_runs(stack):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(stack["events"].router_url + "/v2/models/m/infer", json=ONE_SHOT) as resp:
            assert resp.status == 400
            assert resp.headers["Content-Type"].startswith("application/json")
            assert "ModelStreamInfer" in (await resp.json())["error"]


async def test_a_handler_returning_a_stream_through_one_shot_infer_runs_once_and_answers_one_400(stack):
    deployment = stack["half-stream"]
    calls = deployment.folder / "half-stream-calls"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(deployment.router_url + "/v2/models/m/infer", json=ONE_SHOT) as resp:
            assert resp.status == 400  # never NDJSON to an OIP client, never a 502 after a retry
            assert "ModelStreamInfer" in (await resp.json())["error"]
        assert calls.read_text().splitlines() == ["called"]  # not retried on another try
        # The same handler streams its FP16 chunks where a stream is asked for (native HTTP).
        async with session.post(deployment.router_url + "/", json={}, headers={MODEL_ID_HEADER: "m"}) as resp:
            assert resp.status == 200
            records = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert len(records) == 3
