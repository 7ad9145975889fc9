"""The Endpoint Picker's decisions over ext_proc, as a Gateway asks: a real picker server on
loopback over a real :class:`~modelplex_router.router.Router`, whose table is fed the replicas
(``r0`` holds ``hot``, ``r1`` is empty) as discovery would; no replica process (nothing here
reaches one: the picker only decides)."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import grpc
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from modelplex.wire.credentials import ENV_INTERNAL_TOKEN_FILE, write_token_file
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.proof import PROOF_HEADER, check_proof
from modelplex.wire.spec import parse_deployment
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.base import Discovery
from modelplex_router.events import ReplicaSeen
from modelplex_router.picker.server import PickerServer
from modelplex_router.record import Held
from modelplex_router.router import Router
from modelplex_router.server import picker_port_of
from modelplex_router.table import RoutingTable

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TOKEN = "internal-credential-0123456789"
R0, R1 = "127.0.0.1:1001", "127.0.0.1:1002"
ORIGIN = "https://app.example"


class Quiet(Discovery):
    """Discovery that has nothing to add: the test feeds the table."""

    async def run(self, table: RoutingTable, clock) -> None:
        await asyncio.Event().wait()


@pytest.fixture
async def picker(tmp_path) -> AsyncIterator[tuple[ext_grpc.ExternalProcessorStub, Router]]:
    deployment = parse_deployment({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "d"},
        "spec": {"image": "x", "handler": "m:H", "maxOngoingRequests": 2,
                 "router": {"loadQuota": {"loadsPerMinute": 1, "burst": 1}, "endpointPicker": {"enabled": True},
                            "cors": {"allowOrigins": [ORIGIN]}}}})
    env = {ENV_INTERNAL_TOKEN_FILE: str(write_token_file(tmp_path / "internal", TOKEN))}
    router = Router(RouterConfig.from_deployment(deployment, env), Quiet())
    async with router:
        now = router.clock()
        router.table.apply(ReplicaSeen("r0", f"http://{R0}", True, Held.of(LoadedModels(1, 4, ("hot",)))), now)
        router.table.apply(ReplicaSeen("r1", f"http://{R1}", True, Held.of(LoadedModels(1, 4))), now)
        async with PickerServer(router, "127.0.0.1", 0) as server:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                yield ext_grpc.ExternalProcessorStub(channel), router


def _headers(path: str, **more: str) -> ext.ProcessingRequest:
    sent = {":method": "POST", ":path": path, "content-type": "application/json", **more}
    return ext.ProcessingRequest(request_headers=ext.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in sent.items()])))


def _set(answer: ext.ProcessingResponse) -> dict[str, str]:
    options = answer.request_headers.response.header_mutation.set_headers
    return {o.header.key: o.header.raw_value.decode() for o in options}


async def _ask(stub, message: ext.ProcessingRequest):
    call = stub.Process(timeout=10)
    await call.write(message)
    return call, await call.read()


async def test_a_held_model_goes_to_its_holder_with_a_proof_for_that_replica_and_model(picker):
    stub, router = picker
    call, answer = await _ask(stub, _headers("/v2/models/hot/infer"))
    sent = _set(answer)
    assert sent["x-gateway-destination-endpoint"] == R0 and sent[":path"] == "/v1/invoke"
    assert sent["serve_multiplexed_model_id"] == "hot" and sent["x-modelplex-protocol"] == "oip-v2"
    assert check_proof((TOKEN,), sent[PROOF_HEADER.lower()], "hot", R0, time.time())
    assert not check_proof((TOKEN,), sent[PROOF_HEADER.lower()], "hot", R1, time.time())
    lb = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == R0
    assert TOKEN not in str(answer)  # the credential never leaves the router
    call.cancel()


async def test_the_slot_is_held_until_the_answer_ends_and_internal_answer_headers_are_removed(picker):
    stub, router = picker
    call, _ = await _ask(stub, _headers("/v2/models/hot/infer"))
    holders = {r.name: r for r in router.table.replicas()}
    assert holders["r0"].inflight == 1
    await call.write(ext.ProcessingRequest(response_headers=ext.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":status", raw_value=b"200"),
        base_pb2.HeaderValue(key="x-modelplex-loaded-models", raw_value=b"{}")]))))
    answer = await call.read()
    assert list(answer.response_headers.response.header_mutation.remove_headers) == ["x-modelplex-loaded-models"]
    assert holders["r0"].inflight == 1  # the body is still on its way
    await call.write(ext.ProcessingRequest(response_trailers=ext.HttpTrailers()))
    await call.read()
    assert holders["r0"].inflight == 0
    call.cancel()


async def test_an_answer_of_a_stated_length_asks_for_no_end_and_frees_its_slot_when_the_stream_closes(picker):
    """The replica had all of a fixed-length answer when it sent its headers: the picker asks
    for no more of it (one round trip fewer), and a chunked answer's end is still asked for."""
    stub, router = picker
    replicas = {r.name: r for r in router.table.replicas()}
    for length, asked in (("40", False), (None, True)):
        call, _ = await _ask(stub, _headers("/v2/models/hot/infer"))
        sent = [base_pb2.HeaderValue(key=":status", raw_value=b"200")]
        if length is not None:
            sent.append(base_pb2.HeaderValue(key="content-length", raw_value=length.encode()))
        await call.write(ext.ProcessingRequest(response_headers=ext.HttpHeaders(headers=base_pb2.HeaderMap(
            headers=sent))))
        answer = await call.read()
        assert answer.HasField("mode_override") == asked
        assert replicas["r0"].inflight == 1
        await call.done_writing()  # as Envoy closes the stream when it has nothing more to send
        assert await call.read() == grpc.aio.EOF
        assert replicas["r0"].inflight == 0
        call.cancel()


async def test_with_fallbacks_the_metadata_lists_the_next_replicas_and_the_one_that_served_takes_the_lease(picker):
    """``fallbacks: 1``: the header keeps the one pick, ``envoy.lb`` names the pick then the next
    replica, the proof admits the request on both; when the Gateway says the fallback served,
    the lease moves there (the pick's slot is freed) until the answer ends."""
    _, router = picker
    async with PickerServer(router, "127.0.0.1", 0, fallbacks=1) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call, answer = await _ask(ext_grpc.ExternalProcessorStub(channel), _headers("/v2/models/hot/infer"))
            sent = _set(answer)
            assert sent["x-gateway-destination-endpoint"] == R0
            lb = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
            assert lb["x-gateway-destination-endpoint"].string_value == f"{R0},{R1}"
            for endpoint in (R0, R1):
                assert check_proof((TOKEN,), sent[PROOF_HEADER.lower()], "hot", endpoint, time.time())
            replicas = {r.name: r for r in router.table.replicas()}
            assert replicas["r0"].inflight == 1 and not replicas["r1"].is_loading("hot")
            served = ext.ProcessingRequest(response_headers=ext.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=":status", raw_value=b"200")])))
            served.attributes["envoy.filters.http.ext_proc"].fields["upstream.address"].string_value = R1
            await call.write(served)
            await call.read()
            assert replicas["r0"].inflight == 0 and replicas["r1"].is_loading("hot")
            await call.write(ext.ProcessingRequest(response_trailers=ext.HttpTrailers()))
            await call.read()
            assert not replicas["r1"].is_loading("hot") and replicas["r1"].inflight == 0
            call.cancel()


async def test_the_subset_hint_bounds_the_pick_and_none_of_the_pool_gets_503(picker):
    stub, _ = picker
    for subset, expected in (([R1], R1), (["10.9.9.9:1"], None)):
        message = _headers("/v2/models/hot/infer")
        message.metadata_context.filter_metadata["envoy.lb.subset_hint"].fields[
            "x-gateway-destination-endpoint-subset"].list_value.extend(subset)
        call, answer = await _ask(stub, message)
        if expected is None:
            assert answer.immediate_response.status.code == 503
            assert int(_immediate_headers(answer)["retry-after"]) >= 1
        else:
            assert _set(answer)["x-gateway-destination-endpoint"] == expected
        call.cancel()


def _immediate_headers(answer: ext.ProcessingResponse) -> dict[str, str]:
    return {o.header.key: o.header.raw_value.decode() for o in answer.immediate_response.headers.set_headers}


async def test_a_spent_load_quota_is_429_and_model_control_off_is_403_as_at_the_router(picker):
    stub, _ = picker
    first, answer = await _ask(stub, _headers("/", serve_multiplexed_model_id="cold-a"))
    assert "x-gateway-destination-endpoint" in _set(answer)  # the one cold load the quota allows
    call, answer = await _ask(stub, _headers("/", serve_multiplexed_model_id="cold-b"))
    refusal = answer.immediate_response
    assert refusal.status.code == 429 and orjson.loads(refusal.body)["error"]["code"] == "load_quota_exceeded"
    assert int(_immediate_headers(answer)["retry-after"]) >= 1
    call.cancel()
    call, answer = await _ask(stub, _headers("/v2/repository/models/hot/load"))
    assert answer.immediate_response.status.code == 403
    assert "modelControl" in orjson.loads(answer.immediate_response.body)["error"]  # the OIP shape under /v2
    call.cancel()
    first.cancel()


async def test_a_cors_preflight_is_answered_before_authentication_and_refusals_carry_cors_headers(picker):
    stub, _ = picker
    call, answer = await _ask(stub, _headers("/v2/models/hot/infer", **{
        ":method": "OPTIONS", "origin": ORIGIN, "access-control-request-method": "POST"}))
    assert answer.immediate_response.status.code == 204 and answer.immediate_response.body == b""
    headers = _immediate_headers(answer)
    assert headers["access-control-allow-origin"] == ORIGIN and "POST" in headers["access-control-allow-methods"]
    call.cancel()
    call, answer = await _ask(stub, _headers("/v2/repository/models/hot/load", origin=ORIGIN))
    assert answer.immediate_response.status.code == 403
    assert _immediate_headers(answer)["access-control-allow-origin"] == ORIGIN
    call.cancel()
    call, answer = await _ask(stub, _headers("/v2/models/hot/infer", **{
        ":method": "OPTIONS", "origin": "https://elsewhere.example", "access-control-request-method": "POST"}))
    assert answer.immediate_response.status.code == 204
    assert "access-control-allow-origin" not in _immediate_headers(answer)
    call.cancel()


def test_the_picker_port_is_the_specs_else_9002_in_pods_else_a_free_one_and_none_while_off():
    def deployment(picker: dict):
        return parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                                 "metadata": {"name": "d"},
                                 "spec": {"image": "x", "handler": "m:H", "router": {"endpointPicker": picker}}})

    assert picker_port_of(deployment({}), in_pod=True) is None
    assert picker_port_of(deployment({"enabled": True}), in_pod=True) == 9002
    assert picker_port_of(deployment({"enabled": True}), in_pod=False) == 0
    assert picker_port_of(deployment({"enabled": True, "port": 9100}), in_pod=False) == 9100


async def test_health_is_serving_until_a_drain_and_a_watch_hears_the_drain_and_a_gateway_going_frees_the_slot(picker):
    """Health as Gateways probe an EPP (liveness stays, readiness and the ext_proc service turn
    ``NOT_SERVING`` at a drain, another name is ``NOT_FOUND``); a stream the Gateway resets mid-
    request gives its replica slot back."""
    _, router = picker
    server = PickerServer(router, "127.0.0.1", 0)
    async with server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
                assert (await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)).status == SERVING
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await health.Check(health_pb2.HealthCheckRequest(service="other"), timeout=10)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

            call, _ = await _ask(ext_grpc.ExternalProcessorStub(channel), _headers("/v2/models/hot/infer"))
            replicas = {r.name: r for r in router.table.replicas()}
            assert replicas["r0"].inflight == 1
            call.cancel()  # the Gateway's HTTP request ended without an answer
            for _ in range(100):
                if replicas["r0"].inflight == 0:
                    break
                await asyncio.sleep(0.05)
            assert replicas["r0"].inflight == 0

            watch = health.Watch(health_pb2.HealthCheckRequest(service="readiness"), timeout=10)
            assert (await watch.read()).status == SERVING
            server.drain(5)
            assert (await watch.read()).status == NOT_SERVING
            assert server.health.status("liveness") == SERVING  # (new calls go elsewhere: GOAWAY was sent)
            watch.cancel()
