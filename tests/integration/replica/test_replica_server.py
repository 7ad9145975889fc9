"""A real replica process over HTTP: LRU eviction, batching, streaming, errors, limits."""

import asyncio
import json
import socket

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import START_TIMEOUT_S, free_port, metric, wait_ready, wait_until

TIMEOUT = aiohttp.ClientTimeout(total=60)


async def invoke(session, url, model_id, body, **kwargs):
    headers = {MODEL_ID_HEADER: model_id} if model_id else {}
    async with session.post(url + "/v1/invoke", json=body, headers=headers, **kwargs) as response:
        return response.status, await response.json(), response.headers


async def test_capacity_two_and_three_models_evicts_the_least_recently_used(processes, manifest):
    replica = processes.replica(manifest(multiplexing={"maxModelsPerReplica": 2}, batching={"batchWaitTimeoutMs": 1}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        for model_id in ["a", "b", "a", "c"]:  # b becomes least recently used
            status, body, _ = await invoke(session, replica.url, model_id, {"x": 1})
            assert status == 200 and body["model"] == model_id
        async with session.get(replica.url + "/v1/models") as response:
            document = await response.json()
        assert document["models"] == ["a", "c"]
        assert document["capacity"] == 2
        assert document["version"] == 4  # three loads and one eviction
        assert await metric(session, replica.url, "modelplex_model_evictions_total") == 1
        assert await metric(session, replica.url, "modelplex_model_loads_total") == 3
        assert await metric(session, replica.url, "modelplex_models_loaded") == 2


async def test_eight_concurrent_requests_form_two_batches_of_four(processes, manifest):
    # A 5 s wait timeout: only the size trigger can form these batches quickly.
    replica = processes.replica(manifest(batching={"maxBatchSize": 4}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        await invoke(session, replica.url, "m", {"warm": True}, params={})  # loads m (a batch of 1 after 5 s)
        results = await asyncio.gather(*(invoke(session, replica.url, "m", {"i": i}) for i in range(8)))
        assert [status for status, _, _ in results] == [200] * 8
        assert [body["batch_size"] for _, body, _ in results] == [4] * 8
        assert [body["echo"] for _, body, _ in results] == [{"i": i} for i in range(8)]
        assert await metric(session, replica.url, "modelplex_batch_size_count") == 3


async def test_streaming_first_chunk_arrives_before_the_last_is_produced(processes, manifest, tmp_path):
    replica = processes.replica(manifest(handler="probe:Streamer"))
    signal = tmp_path / "go-on"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        headers = {MODEL_ID_HEADER: "s1"}
        async with session.post(replica.url + "/v1/invoke", json={"signal": str(signal)}, headers=headers) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("application/x-ndjson")
            first = json.loads(await asyncio.wait_for(response.content.readline(), 30))
            # The handler is still waiting for the signal: nothing buffered the stream.
            assert first == {"chunk": "first", "model": "s1"}
            signal.touch()
            last = json.loads(await asyncio.wait_for(response.content.readline(), 30))
            assert last == {"chunk": "last", "signal_seen": True}


async def test_streaming_as_server_sent_events(processes, manifest, tmp_path):
    replica = processes.replica(manifest(handler="probe:Streamer"))
    signal = tmp_path / "go"
    signal.touch()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        headers = {MODEL_ID_HEADER: "s1", "Accept": "text/event-stream"}
        async with session.post(replica.url + "/v1/invoke", json={"signal": str(signal)}, headers=headers) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            text = await response.text()
    events = [json.loads(line.removeprefix("data: ")) for line in text.split("\n\n") if line]
    assert [event["chunk"] for event in events] == ["first", "last"]


async def test_stream_that_fails_midway_ends_with_an_error_record_and_a_cut_connection(processes, manifest):
    replica = processes.replica(manifest(handler="probe:FailsMidStream"))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        lines = []
        try:
            async with session.post(replica.url + "/v1/invoke", json={}) as response:
                async for line in response.content:
                    lines.append(json.loads(line))
            broke = False
        except aiohttp.ClientPayloadError:
            broke = True
    assert lines[0] == {"chunk": 1}
    assert lines[-1]["error"]["code"] == "handler_error"
    assert "stage exploded" in lines[-1]["error"]["message"]
    assert broke, "a failed stream must not look like a finished one"


async def test_the_imports_are_frozen_out_of_garbage_collection_and_the_handlers_models_are_not(processes, manifest):
    replica = processes.replica(manifest(handler="probe:Collectable"))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        status, answer, _ = await invoke(session, replica.url, "", {})
    assert status == 200
    assert answer["frozen"] > 10_000  # torch and the replica's own imports
    assert answer["handler_collectable"] is True
    assert answer["model_collectable"] is True


async def test_bad_requests_get_the_right_status_and_a_json_error(processes, manifest):
    replica = processes.replica(manifest(maxRequestBytes=4096, batching={"batchWaitTimeoutMs": 1}))
    url = replica.url + "/v1/invoke"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        cases = [
            ("malformed JSON", {"data": b"{not json", "headers": {"Content-Type": "application/json", MODEL_ID_HEADER: "m"}}, 400, "bad_request"),
            # Any printable id is a name, as in Ray (dot segments aside: "../x" is a 400); only the
            # unusable are refused.
            ("overlong id", {"json": {}, "headers": {MODEL_ID_HEADER: "x" * 201}}, 400, "bad_request"),
            ("oversize body", {"data": b"x" * 10_000, "headers": {MODEL_ID_HEADER: "m"}}, 413, "payload_too_large"),
            ("failing load", {"json": {}, "headers": {MODEL_ID_HEADER: "broken-1"}}, 500, "model_load_failed"),
        ]
        for what, kwargs, status, code in cases:
            async with session.post(url, **kwargs) as response:
                body = await response.json()
                assert response.status == status, what
                assert body["error"]["code"] == code, what
                assert body["error"]["message"], what
        # The failed load is in the loaded-models document, for the operator's Warning Event.
        async with session.get(replica.url + "/v1/models") as response:
            (failure,) = (await response.json())["failures"]
        assert failure["model"] == "broken-1" and failure["count"] == 1 and failure["error"]
        async with session.get(replica.url + "/v1/nowhere") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "not_found"
        async with session.post(replica.url + "/v1/models/bad%0Aid/load") as response:
            assert response.status == 400
            assert "error" in await response.json()


async def test_unknown_model_file_is_404_from_the_builtin_handler(processes, tmp_path):
    path = tmp_path / "zoo.yaml"
    path.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "zoo"},
        "spec": {"image": "local", "modelSource": {"uri": "file:models/{model_id}.pt"}},
    }))
    replica = processes.replica(path)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        status, body, _ = await invoke(session, replica.url, "no-such-model", {"inputs": [1.0]})
        assert status == 404
        assert body["error"]["code"] == "model_not_found"
        assert "no-such-model" in body["error"]["message"]


async def test_max_ongoing_requests_is_enforced_with_retry_after(processes, manifest):
    replica = processes.replica(manifest(maxOngoingRequests=2, batching={"maxBatchSize": 1}), env={"PROBE_SLOW_S": "1.5"})
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        busy = [asyncio.create_task(invoke(session, replica.url, "m", {"i": i})) for i in range(2)]
        async def both_in_flight():
            return await metric(session, replica.url, "modelplex_replica_inflight_requests") == 2

        await wait_until(both_in_flight, what="2 in flight")
        status, body, headers = await invoke(session, replica.url, "m", {"i": 3})
        assert status == 503
        assert body["error"]["code"] == "overloaded"
        assert int(headers["Retry-After"]) >= 1
        assert [status for status, _, _ in await asyncio.gather(*busy)] == [200, 200]


async def test_load_and_unload_endpoints_and_prewarm(processes, manifest):
    replica = processes.replica(manifest(multiplexing={"prewarm": ["warm-1"]}))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        async with session.get(replica.url + "/v1/models") as response:
            assert (await response.json())["models"] == ["warm-1"]
        async with session.post(replica.url + "/v1/models/extra/load") as response:
            assert response.status == 200 and (await response.json())["loaded"] is True
        async with session.delete(replica.url + "/v1/models/warm-1") as response:
            assert response.status == 200
        async with session.delete(replica.url + "/v1/models/warm-1") as response:
            assert response.status == 404
        async with session.get(replica.url + "/v1/models") as response:
            assert (await response.json())["models"] == ["extra"]
    log = replica.log.read_text()
    assert "Loading model 'extra'." in log and "Unloading model 'warm-1'." in log
    assert "Loaded model 'extra' in" in log


async def test_the_control_port_answers_at_once_while_user_code_holds_the_api_port(processes, manifest):
    control_port = free_port()
    replica = processes.replica(manifest(handler="probe:Computes"), control_port=control_port)
    control = f"http://127.0.0.1:{control_port}"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await wait_ready(session, replica)
        computing = asyncio.create_task(invoke(session, replica.url, "", {"seconds": 8}))

        async def holding() -> bool:
            return await metric(session, control, "modelplex_replica_inflight_requests") == 1

        await wait_until(holding, what="the forward passes to start")
        # The kubelet's probes and Prometheus get their answers while the passes hold the user loop.
        for path in ("/readyz", "/healthz", "/metrics"):
            async with session.get(control + path) as response:
                assert response.status == 200, path
        assert not computing.done()
        # Only those: the API is the API port's (served where user code runs, one way).
        for method, path in (("POST", "/v1/invoke"), ("GET", "/v1/models"), ("POST", "/v1/pins")):
            async with session.request(method, control + path) as response:
                assert response.status == 404 and (await response.json())["error"]["code"] == "not_found", path
        assert not computing.done()
        status, body, _ = await computing
        assert status == 200 and body["passes"] > 0


async def test_a_replica_whose_port_is_taken_exits_1_naming_the_address(processes, manifest):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        replica = processes.replica(manifest(), port=port)
        assert replica.popen.wait(timeout=START_TIMEOUT_S) == 1
    log = replica.log.read_text()
    assert f"cannot serve on 127.0.0.1 (API port {port}, control port none)" in log, log
    assert "Traceback" not in log, log
