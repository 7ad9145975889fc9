"""The suite's view of the EPP under test, and the ext_proc messages it sends."""

from __future__ import annotations

from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext


@dataclass
class Target:
    """The EPP under test and what the pool behind it is."""

    address: str
    endpoints: frozenset[str]
    path: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    #: The fallback endpoints the EPP names after its pick (``envoy.lb``), as it is set up.
    fallbacks: int = 0

    def request_headers(self, *, end_of_stream: bool = False, **more: str) -> ext.HttpHeaders:
        sent = {":method": "POST", ":path": self.path, ":scheme": "http", ":authority": "gateway",
                "content-type": "application/json", "serve_multiplexed_model_id": self.model,
                **self.headers, **more}
        return ext.HttpHeaders(headers=header_map(sent), end_of_stream=end_of_stream)


def header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k.lower(), raw_value=v.encode())
                                       for k, v in headers.items()])
