"""A real Envoy asks the router's Endpoint Picker (ext_proc) where each request goes, and sends it
straight to that replica: in header-only mode and with bodies streamed through the picker
(``FULL_DUPLEX_STREAMED``), as managed Gateways set it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random

import aiohttp
import numpy as np
import pytest

from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.oip import HEADER_LENGTH, split_body

from support.envoy import MODES
from support.servers import free_port, wait_until

pytestmark = pytest.mark.parametrize("mode", MODES)
#: The conftest's client ``alice``, who may call every model; ``bob`` may call only ``public-*``.
AUTH = {"Authorization": "Bearer alice-token-0123456789"}
BOB = {"Authorization": "Bearer bob-token-0123456789"}


async def _call(session: aiohttp.ClientSession, url: str, model: str, body: dict, headers: dict | None = None
                ) -> tuple[int, dict, dict]:
    sent = {**AUTH, MODEL_ID_HEADER: model, **(headers or {})}
    async with session.post(url + "/", json=body, headers=sent) as answer:
        return answer.status, await answer.json(content_type=None), dict(answer.headers)


async def test_requests_land_on_a_replica_that_holds_their_model(gateway, mode):
    """2 replicas, 20 models (10 fit on each): after one warm-up request per model, at least 95%
    of requests find their model loaded where they land. (Both modes route the same 20 models:
    the replicas' caches hold no more.)"""
    url = gateway.url(mode)
    models = [f"zoo-m{i}" for i in range(20)]
    seen: dict[tuple[str, str], int] = {}  # (replica, model) -> its loads, as last answered
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for model in models:
            status, answer, _ = await _call(session, url, model, {"x": [1.0] * 16})
            assert status == 200, answer
            seen[(answer["replica"], model)] = answer["loads"]
        rng = random.Random(39)
        order = [rng.choice(models) for _ in range(200)]
        hits = 0
        for start in range(0, len(order), 8):  # eight at a time, as clients send them
            answers = await asyncio.gather(*(_call(session, url, m, {"x": [0.5] * 16}) for m in order[start:start + 8]))
            for model, (status, answer, _) in zip(order[start:start + 8], answers):
                assert status == 200, answer
                assert answer["model"] == model and len(answer["scores"]) == 4
                key = (answer["replica"], model)
                hits += seen.get(key) == answer["loads"]
                seen[key] = answer["loads"]
    assert hits >= 0.95 * len(order), f"{hits} of {len(order)} requests found their model loaded"
    async with aiohttp.ClientSession() as session, session.get(gateway.control_url + "/metrics") as answer:
        page = await answer.text()
    series = 'modelplex_router_requests_total{code="200",deployment="zoo",protocol="gateway"} '
    answered = [float(line[len(series):]) for line in page.splitlines() if line.startswith(series)]
    assert answered and answered[0] >= len(order), answered  # the picker counts what the Gateway carried


async def test_a_1_mib_binary_oip_body_and_its_answer_pass_intact(gateway, mode):
    blob = np.frombuffer(random.Random(1).randbytes(1 << 20), dtype=np.uint8)
    header = json.dumps({"inputs": [{"name": "blob", "datatype": "UINT8", "shape": [blob.size],
                                     "parameters": {"binary_data_size": blob.size}}],
                         "parameters": {"binary_data_output": True}}).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(gateway.url(mode) + "/v2/models/blob-model/infer", data=header + blob.tobytes(),
                                headers={**AUTH, HEADER_LENGTH: str(len(header)),
                                         "Content-Type": "application/octet-stream"}) as answer:
            body = await answer.read()
            assert answer.status == 200, body[:500]
            length = answer.headers[HEADER_LENGTH]
    head, data = split_body(body, length)
    output = json.loads(head)["outputs"][0]
    assert output["name"] == "blob_echo" and output["parameters"]["binary_data_size"] == blob.size
    assert hashlib.sha256(bytes(data)).digest() == hashlib.sha256(blob.tobytes()).digest()


async def test_a_1_mib_raw_body_reaches_the_handler_whole(gateway, mode):
    blob = random.Random(2).randbytes(1 << 20)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(gateway.url(mode) + "/", data=blob,
                                headers={**AUTH, MODEL_ID_HEADER: "raw-model",
                                         "Content-Type": "application/octet-stream"}) as answer:
            assert answer.status == 200, await answer.text()
            echoed = await answer.json()
    assert echoed["size"] == len(blob) and echoed["sha256"] == hashlib.sha256(blob).hexdigest()


async def test_a_streamed_answer_arrives_whole_and_in_order(gateway, mode):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(gateway.url(mode) + "/", json={"steps": 25},
                                headers={**AUTH, MODEL_ID_HEADER: "stream-model"}) as answer:
            assert answer.status == 200, await answer.text()
            lines = [json.loads(line) async for line in answer.content if line.strip()]
    assert [line["step"] for line in lines] == list(range(25))
    assert all(isinstance(line["total"], float) for line in lines)



async def _inflight(session: aiohttp.ClientSession, gateway) -> int:
    async with session.get(gateway.router_url + "/v1/replicas",
                           headers={INTERNAL_TOKEN_HEADER: gateway.internal_token}) as answer:
        assert answer.status == 200, await answer.text()
        return sum(replica["inflight"] for replica in (await answer.json())["replicas"])


async def test_a_stream_holds_its_replica_slot_until_its_last_chunk(gateway, mode):
    """The picker's view of requests in flight follows the answer: one while a stream runs
    (its chunks a second apart), none once it ended."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        # The model loaded first: a request waiting for its model's load is not in a slot yet.
        status, answer, _ = await _call(session, gateway.url(mode), "slow-stream", {"x": [1.0] * 16})
        assert status == 200, answer
        await wait_until(lambda: _no_inflight(session, gateway), what="no request in flight")
        async with session.post(gateway.url(mode) + "/", json={"steps": 4, "pause": 1.0},
                                headers={**AUTH, MODEL_ID_HEADER: "slow-stream"}) as answer:
            assert answer.status == 200
            first = await answer.content.readline()
            assert json.loads(first)["step"] == 0
            assert await _inflight(session, gateway) == 1
            rest = [line async for line in answer.content if line.strip()]
        assert len(rest) == 3
        await wait_until(lambda: _no_inflight(session, gateway), what="the stream's slot to be freed")


async def _no_inflight(session: aiohttp.ClientSession, gateway) -> bool:
    return await _inflight(session, gateway) == 0


async def test_an_unauthorized_model_gets_the_routers_403_json(gateway, mode):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        status, through_envoy, _ = await _call(session, gateway.url(mode), "secret-model", {}, BOB)
        async with session.post(gateway.router_url + "/", json={},
                                headers={**BOB, MODEL_ID_HEADER: "secret-model"}) as direct:
            assert (status, through_envoy) == (direct.status, await direct.json())
    assert status == 403 and through_envoy["error"]["code"] == "forbidden"
    assert "secret-model" in through_envoy["error"]["message"]


async def test_no_bearer_token_gets_401_and_a_wrong_model_id_a_400_as_from_the_router(gateway, mode):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.post(gateway.url(mode) + "/", json={}, headers={MODEL_ID_HEADER: "m"}) as answer:
            assert answer.status == 401 and (await answer.json())["error"]["code"] == "unauthorized"
        async with session.post(gateway.url(mode) + "/v1/models/a/predict", json={},
                                headers={**AUTH, MODEL_ID_HEADER: "b"}) as answer:
            assert answer.status == 400 and (await answer.json())["error"]["code"] == "bad_request"


async def test_forged_internal_headers_and_a_clients_destination_never_reach_a_replica(gateway, mode):
    """A client naming the protocol (a native body would then be read as an OIP request), the
    destination (a port nothing listens on), a proof and an internal credential gets the answer a
    plain request gets; no internal header comes back."""
    forged = {"X-Modelplex-Protocol": "oip-v2", "X-Modelplex-Model-Version": "7",
              "x-gateway-destination-endpoint": f"127.0.0.1:{free_port()}",
              "X-Modelplex-Proof": "v1.9999999999.forged", "X-Modelplex-Internal-Token": "guess"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for _ in range(4):
            status, answer, headers = await _call(session, gateway.url(mode), "forged-model", {"x": [1.0] * 16},
                                                  forged)
            assert status == 200, answer
            assert answer["model"] == "forged-model" and answer["replica"] in gateway.replicas
            assert not [name for name in headers if name.lower().startswith("x-modelplex-")]


async def test_a_replica_refuses_what_did_not_pass_the_picker(gateway, mode):
    """Straight to a replica's address, past the Gateway: no proof, no answer."""
    address = next(iter(gateway.replicas.values()))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.post(f"http://{address}/v1/invoke", json={"x": [1.0] * 16},
                                headers={MODEL_ID_HEADER: "m", "X-Modelplex-Proof": "v1.9999999999.forged"}) as answer:
            assert answer.status == 401, await answer.text()


async def test_oip_errors_have_the_protocols_shape_as_from_the_router(gateway, mode):
    """A tensor whose data does not fill its shape (the replica refuses it) and a version the
    model does not have (the picker refuses it) answer as the router does: ``{"error": "..."}``."""
    bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0]}]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for path in ("/v2/models/oip-model/infer", "/v2/models/oip-model/versions/2/infer"):
            answers = []
            for base in (gateway.url(mode), gateway.router_url):
                async with session.post(base + path, json=bad, headers=AUTH) as answer:
                    answers.append((answer.status, await answer.json()))
            assert answers[0] == answers[1], path
            status, document = answers[0]
            assert status in (400, 404) and isinstance(document["error"], str), answers


async def test_routes_that_are_not_inference_answer_as_the_router_does(gateway, mode):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for method, path in (("GET", "/v2"), ("GET", "/v2/health/ready"), ("GET", "/healthz"),
                             ("GET", "/v2/models/zoo-m1"), ("GET", "/v2/models/zoo-m1/ready"),
                             ("GET", "/v2/models/zoo-m1/infer"), ("GET", "/v2/nothing-here")):
            answers = []
            for base in (gateway.url(mode), gateway.router_url):
                async with session.request(method, base + path, headers=AUTH) as answer:
                    answers.append((answer.status, await answer.json(content_type=None)))
            assert answers[0] == answers[1], (path, answers)
        async with session.post(gateway.url(mode) + "/v2/repository/index", headers=AUTH) as answer:
            assert answer.status == 200 and all(entry["state"] in ("READY", "LOADING") for entry in await answer.json())
        async with session.get(gateway.url(mode) + "/v1/replicas", headers=AUTH) as answer:
            assert answer.status == 403  # routing internals: not for clients, as at the router
        async with session.get(gateway.url(mode) + "/v1/replicas",
                               headers={INTERNAL_TOKEN_HEADER: gateway.internal_token}) as answer:
            assert answer.status == 404 and "router's HTTP API" in (await answer.json())["error"]["message"]


async def test_a_get_reaches_the_handler_as_the_router_sends_it(gateway, mode):
    """``GET /v1/models/{m}/predict`` (a browser's EventSource): the replica takes a POST to its
    invoke path, told the client's method and path."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.get(gateway.url(mode) + "/v1/models/get-model/predict?a=1", headers=AUTH) as answer:
            assert answer.status == 200, await answer.text()
            echoed = await answer.json()
    assert echoed["model"] == "get-model" and echoed["size"] == 0


async def test_on_cold_reject_gets_the_routers_503_with_retry_after(gateway, mode):
    """A request that may not wait for its model's load (``x-modelplex-on-cold: reject``) is
    refused by the picker as by the router: 503 ``model_not_loaded`` with Retry-After."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        status, document, headers = await _call(session, gateway.url(mode), f"cold-{mode.lower()}", {},
                                                {"x-modelplex-on-cold": "reject"})
    assert status == 503 and document["error"]["code"] == "model_not_loaded", document
    assert int(headers["Retry-After"]) >= 1


async def test_a_request_naming_no_model_reaches_the_handler_as_through_the_router(gateway, mode):
    """No model id (a deployment whose handler needs none): the proof admits it too, and the
    handler's own answer comes back (here its loader's 400 naming the header), as from the router."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        answers = []
        for base in (gateway.url(mode), gateway.router_url):
            async with session.post(base + "/", json={"x": [1.0] * 16}, headers=AUTH) as answer:
                answers.append((answer.status, (await answer.json())["error"]["code"]))
    assert answers[0] == answers[1] and answers[0][0] != 401, answers
