"""``onCold`` and load quotas before routing, and the spec.models settings the router reads
(a real routing table and metrics, a fake clock; the background load is a recorded coroutine)."""

from __future__ import annotations

import asyncio

import pytest

from modelplex.wire.errors import BadRequest, LoadQuotaExceeded, ModelNotFound, ModelNotLoaded
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.spec import ModelEntry, parse_deployment
from modelplex_router.cold import ColdGate, quota_client
from modelplex_router.config import ENV_QUEUE_ORDER, RouterConfig
from modelplex_router.events import ReplicaSeen
from modelplex_router.metrics import RouterMetrics
from modelplex_router.policy import Kind, Params, choose
from modelplex_router.quota import LoadQuotas
from modelplex_router.record import Held
from modelplex_router.rules import ModelRules
from modelplex_router.table import RoutingTable


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Gate:
    """A gate over replicas "r0" (holding "hot") and "r1", recording the loads it starts."""

    def __init__(self, *, rules: ModelRules = ModelRules(), quota: tuple[float, int] | None = None,
                 load_status: int = 200):
        self.clock = FakeClock()
        self.table = RoutingTable()
        self.table.apply(ReplicaSeen("r0", "http://r0", True, Held.of(LoadedModels(1, 4, ("hot",)))), self.clock())
        self.table.apply(ReplicaSeen("r1", "http://r1", True, Held.of(LoadedModels(1, 4))), self.clock())
        self.loads: list[str] = []
        self.load_status = load_status
        self.metrics = RouterMetrics("d")
        quotas = LoadQuotas(quota[0], quota[1], clock=self.clock) if quota else None
        self.gate = ColdGate(self.table, rules, self.metrics, clock=self.clock, load=self._load, quotas=quotas,
                             not_found_s=5.0)

    async def _load(self, model: str) -> int:
        self.loads.append(model)
        return self.load_status

    def metric(self, name: str) -> float:
        return sum(s.value for m in self.metrics.registry.collect() for s in m.samples if s.name == name)


async def test_reject_answers_503_model_not_loaded_at_once_and_starts_the_load():
    g = Gate()
    with pytest.raises(ModelNotLoaded) as raised:
        g.gate.admit("cold", "alice", "reject")
    assert raised.value.status == 503 and raised.value.code == "model_not_loaded" and raised.value.retry_after
    await asyncio.sleep(0)
    assert g.loads == ["cold"]
    assert g.metric("modelplex_router_cold_rejections_total") == 1


async def test_with_reject_a_model_whose_load_answered_404_is_404_for_the_not_found_time_then_tried_again():
    g = Gate(load_status=404)
    with pytest.raises(ModelNotLoaded):
        g.gate.admit("nope", "alice", "reject")
    for _ in range(3):
        await asyncio.sleep(0)  # the background load ends, with 404
    assert g.loads == ["nope"]
    for _ in range(2):  # remembered: 404 naming the model, no new load
        with pytest.raises(ModelNotFound, match="'nope'.*notFoundCacheSeconds") as raised:
            g.gate.admit("nope", "alice", "reject")
        assert raised.value.status == 404
    g.gate.admit("nope", "alice", "hold")  # hold asks a replica, whose own answer is the 404
    g.clock.now += 5.0  # forgotten: a load is tried again
    with pytest.raises(ModelNotLoaded):
        g.gate.admit("nope", "alice", "reject")
    await asyncio.sleep(0)
    assert g.loads == ["nope", "nope"]


async def test_a_load_that_failed_otherwise_is_not_remembered_as_not_found():
    g = Gate(load_status=500)
    with pytest.raises(ModelNotLoaded):
        g.gate.admit("broken", "alice", "reject")
    for _ in range(3):
        await asyncio.sleep(0)
    with pytest.raises(ModelNotLoaded):  # not a 404: still "a load has started"
        g.gate.admit("broken", "alice", "reject")


async def test_reject_passes_a_request_for_a_model_a_replica_holds():
    g = Gate()
    g.gate.admit("hot", "alice", "reject")
    await asyncio.sleep(0)
    assert g.loads == []


async def test_the_model_entry_s_on_cold_applies_and_the_header_overrides_it():
    g = Gate(rules=ModelRules((ModelEntry(match="fast-*", onCold="reject"),)))
    with pytest.raises(ModelNotLoaded):
        g.gate.admit("fast-1", None, None)
    g.gate.admit("fast-2", None, "hold")  # the header wins: it waits for its load
    g.gate.admit("slow", None, None)  # no entry: hold


def test_a_bad_header_is_a_400_naming_it():
    with pytest.raises(BadRequest, match="x-modelplex-on-cold"):
        Gate().gate.admit("hot", None, "later")


async def test_a_client_over_its_load_quota_gets_429_and_no_load_while_loaded_models_pass():
    g = Gate(quota=(1, 1))
    g.gate.admit("cold-1", "alice", None)  # holds: takes alice's one load
    with pytest.raises(LoadQuotaExceeded) as raised:
        g.gate.admit("cold-2", "alice", "reject")
    assert raised.value.status == 429 and raised.value.retry_after == pytest.approx(60.0)
    await asyncio.sleep(0)
    assert g.loads == []  # refused: nothing started
    g.gate.admit("hot", "alice", None)  # a loaded model never counts
    g.gate.admit("cold-2", "bob", None)  # another client has loads of its own
    g.gate.admit("cold-3", None, None)  # the deployment's own components are not limited
    g.clock.now += 60
    g.gate.admit("cold-2", "alice", None)  # refilled
    assert g.metric("modelplex_router_load_quota_refusals_total") == 1


def test_the_quota_client_is_the_auth_client_else_the_address():
    assert quota_client("alice", "10.0.0.1") == "alice"
    assert quota_client("", "10.0.0.1") == "10.0.0.1"
    assert quota_client("internal", "10.0.0.1") is None


def test_the_quota_refusal_label_set_is_bounded():
    metrics = RouterMetrics("d")
    for i in range(150):
        metrics.quota_refused(f"10.0.0.{i}")
    clients = {s.labels["client"] for m in metrics.registry.collect() for s in m.samples
               if s.name == "modelplex_router_load_quota_refusals_total"}
    assert len(clients) == 101 and "other" in clients


def test_max_copies_bounds_the_hot_spread():
    class View:
        def __init__(self, name: str, models: tuple[str, ...], inflight: int):
            self.name, self.models, self.inflight = name, models, inflight

        def holds(self, model: str) -> bool:
            return model in self.models

        def is_loading(self, model: str) -> bool:
            return False

        def waiting(self, model: str) -> int:
            return 0

        @property
        def model_count(self) -> int:
            return len(self.models)

    replicas = [View("a", ("m",), 4), View("b", (), 0)]  # m's holder is full
    free = Params(max_ongoing=4, matching_timeout_s=1.0)
    decision = choose(replicas, "m", free)
    assert decision is not None and decision.kind is Kind.FALLBACK and decision.replica.name == "b"
    bounded = Params(max_ongoing=4, matching_timeout_s=1.0, limits=ModelRules((ModelEntry(match="m", maxCopies=1),)))
    assert choose(replicas, "m", bounded) is None
    assert choose(replicas, "m", bounded, waited_s=5.0) is None  # past the matching timeout too


def test_the_router_config_reads_spec_models_the_load_quota_and_the_queue_order():
    deployment = parse_deployment({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "recs"},
        "spec": {"image": "i", "handler": "m:C", "models": [{"match": "b", "weight": 4, "maxCopies": 2}],
                 "router": {"loadQuota": {"loadsPerMinute": 30}}},
    })
    config = RouterConfig.from_deployment(deployment, env={})
    assert config.models.weight("b") == 4 and config.models.weight("other") == 1
    assert config.params.limits is not None and config.params.limits.max_copies("b") == 2
    assert config.load_quota is not None and config.load_quota.loads_per_minute == 30
    assert config.queue_order == "fair"
    assert RouterConfig.from_deployment(deployment, env={ENV_QUEUE_ORDER: "fifo"}).queue_order == "fifo"
    with pytest.raises(ValueError, match=ENV_QUEUE_ORDER):
        RouterConfig.from_deployment(deployment, env={ENV_QUEUE_ORDER: "lifo"})


async def test_a_handler_without_a_model_loader_has_no_cold_requests():
    g = Gate(rules=ModelRules((ModelEntry(match="*", onCold="reject"),)), quota=(1, 1))
    for name in ("r0", "r1"):  # replicas whose handler loads no models report no capacity
        g.table.apply(ReplicaSeen(name, f"http://{name}", True, Held.of(LoadedModels(2, 0))), g.clock())
    for model in ("x", "y", "z"):
        g.gate.admit(model, "alice", None)
    await asyncio.sleep(0)
    assert g.loads == []
