"""A black-box test suite for any Gateway API Inference Extension Endpoint Picker (EPP): it speaks
Envoy's ext_proc to the picker as a Gateway would (no Envoy needed) and checks what the EPP
protocol asks of an answer. Point it at an EPP with environment variables:

- ``MODELPLEX_EPP_ADDRESS``: the picker's ``host:port`` (plaintext gRPC), required;
- ``MODELPLEX_EPP_ENDPOINTS``: the pool's endpoints, ``ip:port,ip:port``, required;
- ``MODELPLEX_EPP_PATH``: the request's path (default ``/v2/models/{model}/infer``);
- ``MODELPLEX_EPP_MODEL``: a model the pool serves (default ``m``), sent in the path and in the
  ``serve_multiplexed_model_id`` header;
- ``MODELPLEX_EPP_HEADERS``: a JSON object of more request headers (a bearer token, say);
- ``MODELPLEX_EPP_FALLBACKS``: how many fallback endpoints the EPP is set to name after its pick
  in ``envoy.lb`` (default 0: the pick alone; Modelplex: ``spec.router.endpointPicker.fallbacks``).

Run: ``MODELPLEX_EPP_ADDRESS=... MODELPLEX_EPP_ENDPOINTS=... pytest tests/support/epp_suite``.
"""

from __future__ import annotations

import json
import os
from typing import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from support.epp_suite.messages import Target

#: ``pytest tests`` (the whole tree) collects nothing here unless an EPP is named: the suite runs
#: against Modelplex's picker from ``tests/integration/gateway/test_epp_suite.py``.
collect_ignore_glob = [] if os.environ.get("MODELPLEX_EPP_ADDRESS") else ["test_*.py"]


@pytest.fixture(scope="session")
def target() -> Target:
    address = os.environ.get("MODELPLEX_EPP_ADDRESS")
    endpoints = os.environ.get("MODELPLEX_EPP_ENDPOINTS")
    if not address or not endpoints:
        raise pytest.UsageError("set MODELPLEX_EPP_ADDRESS (host:port) and MODELPLEX_EPP_ENDPOINTS (ip:port,...)")
    model = os.environ.get("MODELPLEX_EPP_MODEL", "m")
    return Target(address, frozenset(e.strip() for e in endpoints.split(",") if e.strip()),
                  os.environ.get("MODELPLEX_EPP_PATH", "/v2/models/{model}/infer").format(model=model), model,
                  json.loads(os.environ.get("MODELPLEX_EPP_HEADERS", "{}")),
                  int(os.environ.get("MODELPLEX_EPP_FALLBACKS", "0")))


@pytest.fixture
async def channel(target: Target) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(target.address) as channel:
        yield channel


@pytest.fixture
def processor(channel: grpc.aio.Channel) -> ext_grpc.ExternalProcessorStub:
    return ext_grpc.ExternalProcessorStub(channel)
