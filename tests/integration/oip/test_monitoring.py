"""Monitoring: the router's and the replica's metrics pass ``promtool check metrics`` (Debian's
prometheus package), a request is counted once in each component's own series, and the chart's
Grafana dashboard loads and graphs only series we expose."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from jsonschema import Draft7Validator, ValidationError

from modelplex.wire.names import MODEL_ID_HEADER

CHART = Path(__file__).resolve().parents[3] / "charts" / "modelplex"
TIMEOUT = aiohttp.ClientTimeout(total=60)
#: PromQL words that are not metric names.
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "le", "code", "pod", "reason", "namespace", "deployment",
                "protocol"}


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


async def traffic(session: aiohttp.ClientSession, zoo) -> None:
    for model in ("mlp-a", "mlp-b", "no-such-model"):
        async with session.post(zoo.router_url + "/", json={"inputs": [0.5] * 16},
                                headers={MODEL_ID_HEADER: model}) as resp:
            await resp.read()


def promtool() -> str:
    beside = Path(sys.executable).with_name("promtool")  # where `make tools` puts it
    path = str(beside) if beside.exists() else shutil.which("promtool")
    assert path, "promtool is missing: `make tools` extracts it from Debian's prometheus package"
    return path


async def test_router_and_replica_metrics_pass_promtool(zoo):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await traffic(session, zoo)
        for url in (zoo.router_control_url, zoo.replica_url):
            text = await scrape(session, url)
            run = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                                 timeout=60)
            assert run.returncode == 0 and not run.stdout.strip() and not run.stderr.strip(), \
                f"{url}: {run.stdout}{run.stderr}"


def _series(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


async def test_a_request_is_counted_once_per_component_and_never_under_a_shared_name(zoo):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        router_before = _series(await scrape(session, zoo.router_control_url))
        replica_before = _series(await scrape(session, zoo.replica_url))
        async with session.post(zoo.router_url + "/", json={"inputs": [0.1] * 16},
                                headers={MODEL_ID_HEADER: "mlp-a"}) as resp:
            assert resp.status == 200
        router, replica = _series(await scrape(session, zoo.router_control_url)), _series(await scrape(session, zoo.replica_url))
    router_key = 'modelplex_router_requests_total{code="200",deployment="zoo",protocol="http"}'
    replica_key = 'modelplex_replica_requests_total{code="200",deployment="zoo"}'
    assert router[router_key] - router_before.get(router_key, 0) == 1
    assert replica[replica_key] - replica_before.get(replica_key, 0) == 1
    names = lambda samples: {key.split("{")[0] for key in samples}  # noqa: E731
    assert not names(router) & names(replica), "router and replica share a series name"


async def test_counters_exist_at_zero_before_any_event(stack):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        replica = _series(await scrape(session, stack["hello"].replica_url))
        router = _series(await scrape(session, stack["hello"].router_control_url))
    for key in ('modelplex_model_loads_total{deployment="hello",tier="cold"}',
                'modelplex_model_evictions_total{deployment="hello"}',
                'modelplex_model_load_failures_total{deployment="hello"}'):
        assert replica[key] == 0, key
    for key in ('modelplex_router_cache_misses_total{deployment="hello"}',
                'modelplex_router_retries_total{deployment="hello",reason="replica_failed"}'):
        assert router[key] == 0, key


async def test_the_dashboard_loads_and_every_panel_graphs_a_series_we_expose(zoo):
    dashboard = json.loads((CHART / "dashboards" / "modelplex.json").read_text())
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await traffic(session, zoo)
        exposed = set()
        for url in (zoo.router_control_url, zoo.replica_url):
            exposed |= {key.split("{")[0] for key in _series(await scrape(session, url))}
    assert len(dashboard["panels"]) >= 10
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("requests", "latency", "batch", "cache", "loads", "evictions", "in flight", "per replica"):
        assert topic in titles, topic
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = re.sub(r'\{[^}]*\}|\[[^]]*\]|"[^"]*"', "", target["expr"])
            metrics = {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
                       if w not in PROMQL_WORDS and not re.fullmatch(r"\d.*", w)}
            assert metrics, target["expr"]
            assert metrics <= exposed, (panel["title"], metrics - exposed)


def test_the_values_schema_refuses_unknown_keys_and_takes_the_defaults():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    validator = Draft7Validator(schema)
    validator.validate(values)
    assert values["monitoring"]["podMonitor"]["enabled"] is False
    assert values["monitoring"]["serviceMonitor"]["enabled"] is False
    for bad in ({"nosuchvalue": 1}, {"monitoring": {**values["monitoring"], "podMonitr": {}}},
                {"image": {**values["image"], "tga": "x"}}):
        with pytest.raises(ValidationError, match="Additional properties"):
            validator.validate({**values, **bad})
