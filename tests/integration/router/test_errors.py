"""Bad input and hard times get a clear JSON error with the right status, from a real router."""

from __future__ import annotations

import asyncio

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

TIMEOUT = aiohttp.ClientTimeout(total=60)


async def _error(resp) -> dict:
    body = await resp.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]


async def test_bad_requests_get_json_errors(plex):
    cluster = await plex.start(replicas=1)
    url = cluster.router_url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        # Ids are any printable string, as in Ray (a source escapes them); only what no source can
        # use is refused: an id over the documented maximum length, one with a dot segment.
        for odd in ("a..b", "meta-llama/Llama-2-7b-hf", ".hidden"):
            async with session.post(url + "/", json={}, headers={MODEL_ID_HEADER: odd}) as resp:
                assert resp.status == 200, odd
                assert (await resp.json())["model"] == odd
        for refused in ("x" * 201, "../etc/passwd"):
            async with session.post(url + "/", json={}, headers={MODEL_ID_HEADER: refused}) as resp:
                assert resp.status == 400
                assert (await _error(resp))["code"] == "bad_request"
        async with session.post(url + "/v1/models/bad%0Aid/predict", json={}) as resp:  # a control character
            assert resp.status == 400
            await _error(resp)
        # Every method on the route prefix reaches the handler (as in Ray), with an empty model id
        # when none is named: Echo's loader is not called then.
        async with session.get(url + "/nowhere") as resp:
            assert resp.status == 200 and (await resp.json())["model"] is None
        async with session.post(url + "/healthz") as resp:  # the router's own path: 405 with Allow
            assert resp.status == 405 and "GET" in resp.headers["Allow"]
            await _error(resp)
        # Open Inference Protocol: errors in the protocol's own shape, {"error": "<message>"}.
        async with session.post(url + "/v2/models/m/infer", data=b"raw", headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
            assert "not valid JSON" in (await resp.json())["error"]
        async with session.post(url + "/v2/models/m/infer", json={"no": "inputs"}) as resp:
            assert resp.status == 400
            assert isinstance((await resp.json())["error"], str)
        async with session.post(url + "/", data=b"x" * (9 * 1024 * 1024), headers={MODEL_ID_HEADER: "m"}) as resp:
            assert resp.status == 413
            assert (await _error(resp))["code"] == "payload_too_large"


async def test_the_model_can_be_named_in_the_path(plex):
    cluster = await plex.start(replicas=1)
    url = cluster.router_url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(url + "/v1/models/m-path/predict", json={"a": 1}) as resp:
            assert resp.status == 200
            assert (await resp.json())["model"] == "m-path"
        request = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}
        async with session.post(url + "/v2/models/m-oip/infer", json=request) as resp:
            assert resp.status == 200
            body = await resp.json()  # an OIP answer: the handler's dict as named outputs
            assert body["model_name"] == "m-oip"
            assert next(o for o in body["outputs"] if o["name"] == "model")["data"] == ["m-oip"]
        async with session.post(url + "/any/path", json={"b": 2}, headers={MODEL_ID_HEADER: "m-hdr"}) as resp:
            assert resp.status == 200
            assert (await resp.json())["model"] == "m-hdr"
        async with session.post(url + "/", json={"c": 3}) as resp:  # no model: an empty id, as in Ray
            assert resp.status == 200 and (await resp.json())["model"] is None
        async with session.get(cluster.router_control_url + "/metrics") as resp:
            text = await resp.text()
        ok = [line for line in text.splitlines()
              if line.startswith("modelplex_router_requests_total{") and 'code="200"' in line and 'deployment="plex"' in line
              and 'protocol="http"' in line]
        assert len(ok) == 1 and float(ok[0].rsplit(" ", 1)[1]) == 4.0, ok
        assert "modelplex_router_request_latency_seconds_bucket" in text
        assert "modelplex_router_inflight_requests" in text


async def test_full_replicas_past_the_bound_get_503_with_retry_after(plex, tmp_path):
    gate = tmp_path / "gate"
    cluster = await plex.start(replicas=1, max_ongoing=1,
                               router_env={"MODELPLEX_ROUTING_QUEUE_TIMEOUT_S": "0.5"})
    url = cluster.router_url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        held = asyncio.create_task(session.post(url + "/", json={"gate": str(gate)}, headers={MODEL_ID_HEADER: "m"}))
        try:
            async def busy():
                return (await plex.table(session, url))["r0"]["inflight"] == 1
            await plex.wait_until(busy, what="the first request to hold the only slot")
            async with session.post(url + "/", json={}, headers={MODEL_ID_HEADER: "m"}) as resp:
                assert resp.status == 503
                assert int(resp.headers["Retry-After"]) >= 1
                assert (await _error(resp))["code"] == "overloaded"
        finally:
            gate.touch()
        first = await asyncio.wait_for(held, 30)
        assert first.status == 200
        first.release()
