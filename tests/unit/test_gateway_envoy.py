"""The Envoy bootstrap Modelplex writes for a Gateway's data plane (modelplex.gateway_envoy): what
Envoy 1.40's ext_proc needs of it, as found while preparing its tests (decisions.md)."""

from __future__ import annotations

import json

import pytest

from modelplex.gateway_envoy import (BODY_MODES, DESTINATION_HEADER, EnvoyGateway, envoy_argv, envoy_config,
                                     envoy_config_text, processing_mode)


def gateway(**fields) -> EnvoyGateway:
    return EnvoyGateway(**{"listen_host": "127.0.0.1", "listen_port": 8080, "picker_host": "127.0.0.1",
                           "picker_port": 9002, "admin_port": 9901, **fields})


def http_filters(config: dict, index: int = 0) -> list[dict]:
    listener = config["static_resources"]["listeners"][index]
    return listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]


def ext_proc(config: dict, index: int = 0) -> dict:
    return next(f for f in http_filters(config, index) if f["name"] == "envoy.filters.http.ext_proc")["typed_config"]


def cluster(config: dict, name: str) -> dict:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def test_each_request_goes_to_the_one_endpoint_the_picker_wrote_in_its_header():
    replicas = cluster(envoy_config(gateway()), "replicas")
    assert (replicas["type"], replicas["lb_policy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")
    assert replicas["original_dst_lb_config"] == {"use_http_header": True,
                                                  "http_header_name": "x-gateway-destination-endpoint"}


def test_the_picker_is_asked_over_http2_and_its_metadata_is_taken_in_and_the_subset_hint_passed_on():
    config = envoy_config(gateway())
    picker = cluster(config, "picker")
    assert picker["type"] == "STATIC"
    options = picker["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}
    assert ext_proc(config)["metadata_options"] == {"receiving_namespaces": {"untyped": ["envoy.lb"]},
                                                    "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]}}
    assert ext_proc(config)["mutation_rules"] == {"allow_all_routing": True}
    # A Service name (in a cluster) is resolved by Envoy.
    assert cluster(envoy_config(gateway(picker_host="zoo.team-a.svc")), "picker")["type"] == "STRICT_DNS"


def test_a_client_s_own_destination_header_is_removed_before_the_picker_is_asked():
    names = [f["name"] for f in http_filters(envoy_config(gateway()))]
    assert names == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    mutation = http_filters(envoy_config(gateway()))[0]["typed_config"]["mutations"]
    assert mutation == {"request_mutations": [{"remove": DESTINATION_HEADER}]}


def test_full_duplex_sends_trailers_both_ways_and_header_only_sends_no_body():
    assert processing_mode("FULL_DUPLEX_STREAMED") == {
        "request_header_mode": "SEND", "response_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED", "response_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"}
    assert processing_mode("NONE")["request_body_mode"] == "NONE"
    assert processing_mode("NONE")["request_trailer_mode"] == "SKIP"
    with pytest.raises(ValueError, match="body mode must be one of NONE, FULL_DUPLEX_STREAMED"):
        processing_mode("BUFFERED")  # type: ignore[arg-type]


def test_the_failure_mode_and_the_message_timeout_reach_the_filter():
    assert ext_proc(envoy_config(gateway()))["failure_mode_allow"] is False
    assert ext_proc(envoy_config(gateway(failure_mode="FailOpen")))["failure_mode_allow"] is True
    assert ext_proc(envoy_config(gateway(message_timeout_s=12.5)))["message_timeout"] == "12.500s"
    # The default covers the picker's longest wait (60 s at zero replicas).
    assert float(ext_proc(envoy_config(gateway()))["message_timeout"].rstrip("s")) >= 60


def test_more_listeners_each_with_its_body_mode():
    config = envoy_config(gateway(more_listeners=((8081, "FULL_DUPLEX_STREAMED"),)))
    ports = [listener["address"]["socket_address"]["port_value"] for listener in config["static_resources"]["listeners"]]
    assert ports == [8080, 8081]
    assert [ext_proc(config, i)["processing_mode"]["request_body_mode"] for i in (0, 1)] == list(BODY_MODES)


def test_the_admin_port_is_on_loopback_and_the_text_is_json():
    config = envoy_config(gateway(listen_host="0.0.0.0"))
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    assert json.loads(envoy_config_text(gateway())) == envoy_config(gateway())


def test_envoy_runs_with_one_worker_and_no_hot_restart():
    assert envoy_argv("envoy", "/c.json") == ["envoy", "-c", "/c.json", "--concurrency", "1",
                                              "--disable-hot-restart", "--log-level", "error"]
    assert envoy_argv("envoy", "/c.json", validate=True)[-2:] == ["--mode", "validate"]


def test_override_host_balances_the_pickers_ordered_list_and_retries_down_it():
    config = envoy_config(gateway(load_balancing="override_host", endpoints=("127.0.0.1:7001", "127.0.0.1:7002"),
                                  retries=2))
    replicas = cluster(config, "replicas")
    assert replicas["type"] == "STATIC"
    hosts = replicas["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [h["endpoint"]["address"]["socket_address"]["port_value"] for h in hosts] == [7001, 7002]
    policy = replicas["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    # The metadata only: a header source would put the header's pick in the list a second time.
    assert policy["typed_config"]["override_host_sources"] == [
        {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION_HEADER}]}}]
    route = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["retry_policy"] == {"retry_on": "connect-failure,refused-stream", "num_retries": 2}
    assert ext_proc(config)["response_attributes"] == ["upstream.address"]
    with pytest.raises(ValueError, match="endpoints"):
        envoy_config(gateway(load_balancing="override_host"))
