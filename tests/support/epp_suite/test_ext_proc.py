"""What the EPP protocol (GAIE ``docs/proposals/004-endpoint-picker-protocol``) asks of a picker,
checked over ext_proc as a Gateway speaks it. Every exchange is bounded by a deadline."""

from __future__ import annotations

import random

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from support.epp_suite.messages import header_map

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
DEADLINE_S = 30
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def _set_headers(answer: ext.ProcessingResponse) -> dict[str, base_pb2.HeaderValueOption]:
    common = answer.request_headers.response
    return {option.header.key.lower(): option for option in common.header_mutation.set_headers}


def _value(option: base_pb2.HeaderValueOption) -> str:
    return option.header.raw_value.decode() or option.header.value


def _pick(answer: ext.ProcessingResponse) -> str:
    """The picked endpoint, checked against the protocol: one ``ip:port`` in the header, set so
    that it replaces a client's, and first in ``envoy.lb`` metadata."""
    assert answer.WhichOneof("response") == "request_headers", answer
    option = _set_headers(answer)[DESTINATION]
    assert option.append_action == OVERWRITE or not option.append.value, option
    picked = _value(option)
    assert "," not in picked and picked.rpartition(":")[2].isdigit(), picked
    metadata = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION].string_value
    assert metadata.split(",")[0].strip() == picked, (metadata, picked)
    return picked


async def _exchange(processor, *messages: ext.ProcessingRequest) -> list[ext.ProcessingResponse]:
    call = processor.Process(timeout=DEADLINE_S)
    answers = []
    for message in messages:
        await call.write(message)
        answers.append(await call.read())
    await call.done_writing()
    call.cancel()
    return answers


def _subset_hint(*endpoints: str) -> base_pb2.Metadata:
    hint = struct_pb2.Struct()
    hint.fields[SUBSET].list_value.extend(list(endpoints))
    metadata = base_pb2.Metadata()
    metadata.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return metadata


async def test_health_serves_liveness_readiness_and_the_ext_proc_service(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        answer = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service


async def test_a_header_only_request_gets_one_endpoint_of_the_pool(target, processor):
    answer, = await _exchange(processor, ext.ProcessingRequest(request_headers=target.request_headers()))
    assert _pick(answer) in target.endpoints


async def test_a_clients_own_destination_header_does_not_choose_the_endpoint(target, processor):
    forged = "10.255.255.1:1"
    for _ in range(4):
        answer, = await _exchange(processor, ext.ProcessingRequest(
            request_headers=target.request_headers(**{DESTINATION: forged})))
        picked = _pick(answer)
        assert picked != forged and picked in target.endpoints


async def test_the_subset_hint_bounds_the_pick(target, processor):
    for endpoint in sorted(target.endpoints):
        answer, = await _exchange(processor, ext.ProcessingRequest(request_headers=target.request_headers(),
                                                                   metadata_context=_subset_hint(endpoint)))
        assert _pick(answer) == endpoint


def _listed(answer: ext.ProcessingResponse) -> list[str]:
    """The ordered list in ``envoy.lb`` (the pick, then its fallbacks)."""
    value = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION].string_value
    return [part.strip() for part in value.split(",")]


async def test_the_fallback_list_is_the_pick_then_other_endpoints_of_the_pool_within_the_subset(target, processor):
    """``envoy.lb`` names the header's one pick first, then (as the EPP is set up) up to that many
    other endpoints of the pool, each once; under a subset hint, only endpoints of the subset."""
    answer, = await _exchange(processor, ext.ProcessingRequest(request_headers=target.request_headers()))
    picked, listed = _pick(answer), _listed(answer)
    assert listed[0] == picked and len(set(listed)) == len(listed), listed
    assert set(listed) <= target.endpoints, listed
    assert len(listed) == 1 + min(target.fallbacks, len(target.endpoints) - 1), listed
    endpoint = sorted(target.endpoints)[0]
    answer, = await _exchange(processor, ext.ProcessingRequest(request_headers=target.request_headers(),
                                                               metadata_context=_subset_hint(endpoint)))
    assert _listed(answer) == [endpoint]


async def test_a_subset_with_no_endpoint_of_the_pool_gets_503(target, processor):
    answer, = await _exchange(processor, ext.ProcessingRequest(request_headers=target.request_headers(),
                                                               metadata_context=_subset_hint("10.255.255.1:1")))
    assert answer.WhichOneof("response") == "immediate_response", answer
    assert answer.immediate_response.status.code == 503


async def test_the_response_phase_is_answered_and_the_served_endpoint_taken(target, processor):
    call = processor.Process(timeout=DEADLINE_S)
    await call.write(ext.ProcessingRequest(request_headers=target.request_headers()))
    picked = _pick(await call.read())
    await call.write(ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=header_map({":status": "200", "content-type": "application/json",
                            "x-gateway-destination-endpoint-served": picked}), end_of_stream=True)))
    answer = await call.read()
    assert answer.WhichOneof("response") == "response_headers", answer
    await call.done_writing()
    call.cancel()


async def test_bodies_are_echoed_byte_for_byte_in_full_duplex_streaming(target, processor):
    rng = random.Random(4)
    chunks = [rng.randbytes(size) for size in (1, 65536, 300_000, 7)]
    config = ext.ProtocolConfiguration(request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX)
    call = processor.Process(timeout=DEADLINE_S)
    await call.write(ext.ProcessingRequest(request_headers=target.request_headers(), protocol_config=config))
    assert _pick(await call.read()) in target.endpoints
    for phase in ("request_body", "response_body"):
        if phase == "response_body":
            await call.write(ext.ProcessingRequest(response_headers=ext.HttpHeaders(
                headers=header_map({":status": "200", "content-type": "application/octet-stream"}))))
            assert (await call.read()).WhichOneof("response") == "response_headers"
        echoed = b""
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            await call.write(ext.ProcessingRequest(**{phase: ext.HttpBody(body=chunk, end_of_stream=last)}))
            answer = await call.read()
            assert answer.WhichOneof("response") == phase, answer
            streamed = getattr(answer, phase).response.body_mutation.streamed_response
            assert streamed.end_of_stream == last
            echoed += streamed.body
        assert echoed == b"".join(chunks)
    await call.write(ext.ProcessingRequest(response_trailers=ext.HttpTrailers(trailers=header_map({}))))
    assert (await call.read()).WhichOneof("response") == "response_trailers"
    await call.done_writing()
    call.cancel()
