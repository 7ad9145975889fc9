"""spec.multiplexing's cache fields: byte quantities, budgets, policies; the CRD agrees."""

import re
from pathlib import Path

import pytest
import yaml

from modelplex.wire.spec import (DEFAULT_LOAD_TIMEOUT_S, DEFAULT_MAX_CONCURRENT_LOADS, SpecError, parse_quantity,
                                 parse_spec)

CRD = Path(__file__).resolve().parents[3] / "crds" / "multiplexeddeployments.modelplex.io.yaml"


def multiplexing(**fields):
    return parse_spec({"image": "x", "handler": "m:C", "multiplexing": fields}).multiplexing


@pytest.mark.parametrize("quantity, expected", [
    ("12Gi", 12 * 2**30), ("500M", 500_000_000), ("1.5Gi", 3 * 2**29), ("1e9", 10**9), ("64Ki", 65536),
    ("100", 100), (2048, 2048), ("0.5k", 500), ("+1Mi", 2**20),
])
def test_byte_quantities_read_as_kubernetes_reads_them(quantity, expected):
    assert parse_quantity(quantity) == expected


def test_the_cache_defaults():
    spec = multiplexing()
    assert spec.max_model_bytes is None and spec.memory_fraction is None
    assert spec.max_concurrent_loads == DEFAULT_MAX_CONCURRENT_LOADS == 3
    assert spec.load_timeout_seconds == DEFAULT_LOAD_TIMEOUT_S
    assert spec.host_cache_bytes == 0 and spec.eviction_policy == "lru"


def test_quantities_are_bytes_in_the_parsed_spec():
    spec = multiplexing(maxModelBytes="12Gi", hostCacheBytes="8G", evictionPolicy="lfu")
    assert (spec.max_model_bytes, spec.host_cache_bytes, spec.eviction_policy) == (12 * 2**30, 8 * 10**9, "lfu")


@pytest.mark.parametrize("fields, message", [
    ({"maxModelBytes": "12GB"}, "spec.multiplexing.maxModelBytes: must be a byte quantity such as 12Gi"),
    ({"maxModelBytes": -1}, "spec.multiplexing.maxModelBytes: must be >= 0"),
    ({"maxModelBytes": "0"}, "spec.multiplexing.maxModelBytes: must be at least 1 byte"),
    ({"hostCacheBytes": True}, "spec.multiplexing.hostCacheBytes: must be a byte quantity"),
    ({"memoryFraction": 0}, "spec.multiplexing.memoryFraction:"),
    ({"memoryFraction": 1.2}, "spec.multiplexing.memoryFraction:"),
    ({"maxModelBytes": "1Gi", "memoryFraction": 0.5}, "spec.multiplexing: maxModelBytes and memoryFraction both set"),
    ({"maxConcurrentLoads": 0}, "spec.multiplexing.maxConcurrentLoads:"),
    ({"loadTimeoutSeconds": 0}, "spec.multiplexing.loadTimeoutSeconds:"),
    ({"evictionPolicy": "fifo"}, "spec.multiplexing.evictionPolicy: must be one of lru, lfu (got 'fifo')"),
])
def test_errors_name_the_field(fields, message):
    with pytest.raises(SpecError) as error:
        multiplexing(**fields)
    assert message in str(error.value)


def test_the_crd_defaults_and_policies_are_the_specs():
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = schema["properties"]["spec"]["properties"]["multiplexing"]["properties"]
    spec = multiplexing()
    assert fields["maxConcurrentLoads"]["default"] == spec.max_concurrent_loads
    assert fields["loadTimeoutSeconds"]["default"] == spec.load_timeout_seconds
    assert fields["hostCacheBytes"]["default"] == spec.host_cache_bytes
    assert fields["evictionPolicy"]["default"] == spec.eviction_policy
    assert fields["evictionPolicy"]["enum"] == ["lru", "lfu"]
    assert "default" not in fields["maxModelBytes"] and "default" not in fields["memoryFraction"]
    pattern = re.compile(fields["maxModelBytes"]["pattern"])
    for good in ("12Gi", "500M", "1e9", "100"):
        assert pattern.match(good)
    assert not pattern.match("12GB")
