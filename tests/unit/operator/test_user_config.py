"""``spec.userConfig``: a change of it alone rolls no pod (the pod template's hash leaves it out,
the spec ConfigMap a new pod reads holds it), the operator decides which ready replicas to send
it to and says in the status which applied it; the status keeper sends it to a real replica app
and writes what it found."""

from __future__ import annotations

import kopf
import pytest
import yaml
from aiohttp.test_utils import TestServer
from unit.operator.objects import UID, body, deployment_of

from modelplex.wire.spec import parse_deployment
from modelplex.wire.user_config import config_hash
from modelplex_operator import builders
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers.keeper import StatusKeeper
from modelplex_operator.handlers.lifecycle import Operator
from modelplex_operator.handlers.observe import Indexes, resource_view
from modelplex_operator.status import OK, DeploymentView, Outcome, PodView, condition
from modelplex_operator.user_config import CONDITION, PodState, due, summarize
from modelplex_replica.app import create_app

KEY = ("team-a", "recs")
OWNER = builders.owner_reference(body())
T0 = "2026-01-01T00:00:00Z"


def replica_template(doc: dict) -> dict:
    return builders.replica_deployment(deployment_of(doc), OWNER, builders.BuildSettings())["spec"]["template"]


def test_a_change_of_user_config_alone_rolls_no_pod_and_a_new_pod_reads_the_current_value():
    before, after = body(userConfig={"threshold": 0.5}), body(userConfig={"threshold": 0.9})
    assert replica_template(before) == replica_template(after)  # the same template: no rollout
    assert replica_template(body(userConfig={"threshold": 0.5}, image="img:2")) != replica_template(before)
    document = builders.config_map(deployment_of(after), OWNER)["data"][builders.SPEC_FILE]
    assert parse_deployment(yaml.safe_load(document)).spec.user_config == {"threshold": 0.9}


def pods(*names: str, ready: bool = True) -> list[PodView]:
    return [PodView(name=name, ready=ready, ip=f"10.0.0.{i + 1}") for i, name in enumerate(names)]


def test_the_value_goes_to_the_ready_pods_that_have_not_applied_it_and_not_to_one_that_refused_it():
    wanted = config_hash({"a": 1})
    known = {
        "applied": PodState(applied=wanted, tried=wanted),
        "older": PodState(applied=config_hash({"a": 0}), tried=config_hash({"a": 0})),
        "refused": PodState(applied=None, tried=wanted, error="HTTP 500: ValueError: no", refused=True),
        "unanswered": PodState(tried=wanted, error="no answer within 60 s", retry_at=50.0),
    }
    everyone = pods("applied", "older", "refused", "unanswered", "new") + \
        [PodView(name="starting", ready=False, ip="10.0.0.9"), PodView(name="going", ready=True, deleting=True,
                                                                        ip="10.0.0.8")]
    assert [pod.name for pod in due(known, wanted, everyone, now=10.0)] == ["older", "new"]
    assert [pod.name for pod in due(known, wanted, everyone, now=50.0)] == ["older", "unanswered", "new"]


def test_the_condition_says_which_replicas_lack_the_value_and_why():
    wanted = config_hash({"a": 1})
    known = {"r-1": PodState(applied=wanted, tried=wanted),
             "r-2": PodState(applied=config_hash({"a": 0}), tried=wanted, error="HTTP 500: ValueError: no",
                             refused=True)}
    status, failed = summarize(known, wanted, pods("r-1", "r-2"), generation=3)
    assert status == {"hash": wanted, "applied": 1, "replicas": [{"name": "r-1", "hash": wanted},
                                                                {"name": "r-2", "hash": config_hash({"a": 0})}]}
    assert (failed["type"], failed["status"], failed["reason"], failed["observedGeneration"]) == \
        (CONDITION, "False", "ReconfigureFailed", 3)
    assert failed["message"] == f"1/2 ready replicas applied userConfig {wanted}; reconfigure raised on " \
                                "r-2: HTTP 500: ValueError: no"
    _, applying = summarize({"r-1": known["r-1"]}, wanted, pods("r-1", "r-2"), generation=3)
    assert (applying["status"], applying["reason"]) == ("False", "Applying")
    _, none_ready = summarize({}, wanted, pods("r-1", ready=False), generation=3)
    assert (none_ready["status"], none_ready["reason"]) == ("True", "Applied")
    assert "new replicas start with" in none_ready["message"]


class Thresholded:
    def __init__(self):
        self.threshold = 0.5

    def reconfigure(self, config: dict) -> None:  # a sync reconfigure, as Ray's docs write it
        self.threshold = config["threshold"]

    async def __call__(self, body):
        return {"threshold": self.threshold}


@pytest.fixture
def events(monkeypatch) -> list[tuple[str, str, str]]:
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda obj, type, reason, message: posted.append((type, reason, message)))
    return posted


async def test_the_status_keeper_sends_a_new_user_config_and_writes_which_replicas_applied_it(api, events):
    handler = Thresholded()
    replica = TestServer(create_app(deployment_of(body(userConfig={"threshold": 0.5})), handler), host="127.0.0.1")
    await replica.start_server()
    operator = Operator.build(OperatorConfig(), api.kube())
    ctx = operator.context
    ctx.record(KEY, Outcome(UID, 1, OK, "Reconciled"))
    keeper = StatusKeeper(ctx, operator.keeper.repair, debounce_s=0.01, clock=lambda: T0)
    keeper.user_configs.port = replica.port
    try:
        view = resource_view(body(userConfig={"threshold": 0.9}, replicas=1))
        view["metadata"]["resourceVersion"] = "7"
        ctx.indexes = Indexes(resources={KEY: [view]}, pods={KEY: [PodView("recs-replica-0", ready=True,
                                                                           ip="127.0.0.1")]},
                              deployments={KEY: [DeploymentView("recs-replica", "replica", 1, 1, 1, 1, 1, 1, 1),
                                                 DeploymentView("recs-router", "router", 1, 1, 1, 1, 1, 1, 1)]})
        written = await keeper.refresh(KEY)
    finally:
        await keeper.stop()
        await replica.close()
    assert handler.threshold == 0.9
    assert written is not None
    assert written["userConfig"] == {"hash": config_hash({"threshold": 0.9}), "applied": 1,
                                     "replicas": [{"name": "recs-replica-0", "hash": config_hash({"threshold": 0.9})}]}
    assert condition(written, CONDITION)["status"] == "True"
    assert ("Normal", "UserConfigApplied",
            f"userConfig {config_hash({'threshold': 0.9})} applied on 1 ready replica(s) (reconfigure; no restart)") \
        in events
