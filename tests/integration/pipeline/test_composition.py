"""Composition: one deployment calling another through a handle, as Ray Serve's
Upstream → Downstream example does, with the model id travelling along."""

from __future__ import annotations

import json

from modelplex.wire.names import MODEL_ID_HEADER


async def test_upstream_passes_the_model_id_it_chose_and_gets_the_result(composition, session):
    # The seed's example: Upstream asks Downstream for model "bar" and returns its answer.
    url = composition.url("upstream")
    async with session.post(url + "/", json={"model": "bar", "x": 1}) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    assert answer["downstream"] == {"model": "bar", "loaded": "bar", "echo": {"model": "bar", "x": 1}}
    assert answer["upstream_model"] == ""


async def test_upstream_passes_its_own_requests_model_id_on(composition, session):
    url = composition.url("upstream")
    async with session.post(url + "/", json={"x": 2}, headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    assert answer["upstream_model"] == "faces-v1"
    assert answer["downstream"]["model"] == "faces-v1" and answer["downstream"]["loaded"] == "faces-v1"
    # The call went through Downstream's router, which now routes faces-v1 to where it is loaded.
    async with session.get(composition.url("downstream") + "/v1/replicas") as response:
        holders = [r["name"] for r in (await response.json())["replicas"] if "faces-v1" in r["models"]]
    assert len(holders) == 1


async def test_a_downstream_error_reaches_the_client_with_its_reason(composition, session):
    # An invalid model id (a control character) is refused by the handle (400); Upstream raises
    # it, and the client sees the reason, not a bare 500.
    url = composition.url("upstream")
    async with session.post(url + "/", json={"model": "bad\tid"}) as response:
        assert response.status == 400, await response.text()
        error = (await response.json())["error"]
    assert error["code"] == "bad_request"
    assert error["message"].startswith("downstream: ")


async def test_a_handle_streams_chunks_bigger_than_aiohttps_line_buffer(composition, session):
    # A chunk of frames easily passes aiohttp's readline limit (512 KiB); a handle must
    # pass NDJSON chunks of any reasonable size.
    body = {"chunks": 3, "size": 3 * 1024 * 1024}
    async with session.post(composition.url("collector") + "/", json=body) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    assert answer["error"] is None
    assert answer["got"] == [{"index": i, "pad": 3 * 1024 * 1024} for i in range(3)]


async def test_a_stream_failing_part_way_raises_in_the_caller_and_no_error_record_passes_as_data(
        composition, session):
    body = {"chunks": 5, "size": 100, "fail_at": 2}
    async with session.post(composition.url("collector") + "/", json=body) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    # Exactly the chunks made before the failure; the error record is not one of them.
    assert answer["got"] == [{"index": 0, "pad": 100}, {"index": 1, "pad": 100}]
    assert answer["error"]["code"] == "handler_error"
    assert answer["error"]["message"].startswith("producer: ")
    assert "the producer broke at chunk 2" in answer["error"]["message"]


async def test_a_chunk_that_looks_like_an_error_record_but_ends_cleanly_is_data(composition, session):
    # Only a stream that is cut makes its last record an error; a clean end keeps it data.
    async with session.post(composition.url("producer") + "/", json={"chunks": 1, "size": 1}) as response:
        first = json.loads(await response.read())
    assert first == {"index": 0, "pad": "x"}
