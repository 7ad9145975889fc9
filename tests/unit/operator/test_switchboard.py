"""main.py, the switchboard: which kopf decorator wires each handler to which resources, causes
and filters (asked of kopf's public decorators as main.py calls them, never of kopf's registry),
and what each handler does with an event, called as kopf calls it (its documented keyword
arguments). The e2e suite runs the same handlers in a real operator."""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

import kopf
import pytest
from unit.operator.objects import body

import modelplex_operator.main as main
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers import lifecycle
from modelplex_operator.handlers.keeper import StatusKeeper
from modelplex_operator.handlers.lifecycle import MEMO_KEY, Operator
from modelplex_operator.status import INVALID, OK

CR = ("modelplex.io", "v1alpha1", "multiplexeddeployments")
PODS = ("v1", "pods")
DEPLOYMENTS = ("apps", "v1", "deployments")
DECORATORS = ("startup", "cleanup", "probe", "login", "resume", "create", "update", "delete", "field", "event",
              "daemon", "timer", "index", "validate", "mutate")


@pytest.fixture(scope="module")
def wiring() -> dict[str, list[tuple[str, tuple, dict]]]:
    """Handler name -> the (decorator, positional, keyword arguments) main.py wires it with: main.py
    run afresh with each ``kopf.on.*`` and ``kopf.index`` recording what it was asked."""
    wired: dict[str, list[tuple[str, tuple, dict]]] = {}

    def recording(decorator: str):
        def arguments(*args: Any, **kwargs: Any):
            def decorate(handler):
                wired.setdefault(handler.__name__, []).append((decorator, args, kwargs))
                return handler
            return decorate
        return arguments

    with pytest.MonkeyPatch.context() as patch:
        for name in DECORATORS:
            patch.setattr(kopf.on, name, recording(name))
        patch.setattr(kopf, "index", recording("index"))
        spec = importlib.util.spec_from_file_location("switchboard_as_wired", main.__file__)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return wired


def test_a_resource_is_reconciled_when_created_updated_and_at_every_operator_start(wiring):
    assert sorted(wiring["reconcile_resource"]) == [("create", CR, {}), ("resume", CR, {}), ("update", CR, {})]


def test_no_deletion_handler_daemon_or_timer_so_kopf_adds_no_finalizer(wiring):
    # Deleting a MultiplexedDeployment never waits for the operator: its objects go with it
    # (owner references), and only deletion handlers would make kopf add a finalizer.
    used = {decorator for wirings in wiring.values() for decorator, _, _ in wirings}
    assert used == {"startup", "cleanup", "probe", "resume", "create", "update", "event", "index"}


def test_every_event_of_a_resource_its_replica_pods_and_its_deployments_reaches_the_status(wiring):
    assert wiring["on_resource_event"] == [("event", CR, {})]
    assert wiring["on_replica_pod_event"] == [("event", PODS, {"labels": main.REPLICA_PODS})]
    assert wiring["on_deployment_event"] == [("event", DEPLOYMENTS, {"labels": main.OURS})]
    assert wiring["mxd_by_key"] == [("index", CR, {})]
    assert wiring["replica_pods_by_owner"] == [("index", PODS, {"labels": main.REPLICA_PODS})]
    assert wiring["deployments_by_owner"] == [("index", DEPLOYMENTS, {"labels": main.OURS})]


def test_filters_select_only_the_operators_objects():
    assert main.OURS == {"app.kubernetes.io/managed-by": "modelplex-operator", "modelplex.io/deployment": kopf.PRESENT}
    assert main.REPLICA_PODS == {**main.OURS, "modelplex.io/role": "replica"}


def test_every_handler_is_async_so_none_runs_in_kopfs_threads(wiring):
    for name in wiring:
        assert inspect.iscoroutinefunction(getattr(main, name)), name


# --------------------------------------------------------------------------- the handlers, called


class PokeRecorder(StatusKeeper):
    """The real keeper, its pokes recorded instead of acted on (test_keeper.py tests the acting)."""

    def __init__(self, keeper: StatusKeeper):
        super().__init__(keeper.ctx, keeper.repair)
        self.pokes: list[tuple[tuple[str, str], bool]] = []

    def poke(self, key, *, repair=False) -> None:
        self.pokes.append((key, repair))


@pytest.fixture
async def memo(api) -> kopf.Memo:
    """The operator as startup builds it, its keeper's pokes recorded."""
    operator = Operator.build(OperatorConfig(), api.kube())
    operator.keeper = PokeRecorder(operator.keeper)
    yield kopf.Memo({MEMO_KEY: operator})
    await operator.autoscaler.stop()  # a resource event starts it


@pytest.fixture
def posted(monkeypatch) -> list[tuple[str, str]]:
    """Events (kopf's poster runs only inside a running operator)."""
    events: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda obj, type, reason, message: events.append((type, reason)))
    return events


def indexes(**overrides: Any) -> dict[str, Any]:
    """The index keyword arguments kopf passes every handler."""
    return {"mxd_by_key": {}, "replica_pods_by_owner": {}, "deployments_by_owner": {}, **overrides}


async def test_a_resource_event_refreshes_its_status_from_the_indexes(memo):
    resources = {("team-a", "recs"): [{"metadata": {"name": "recs"}}]}
    await main.on_resource_event(namespace="team-a", name="recs", memo=memo, type="MODIFIED", body={},
                                 **indexes(mxd_by_key=resources))
    operator = memo[MEMO_KEY]
    assert operator.keeper.pokes == [(("team-a", "recs"), False)]
    assert operator.context.indexes.resources is resources


async def test_a_replica_pod_event_refreshes_its_owners_status(memo):
    labels = {"modelplex.io/deployment": "recs", "modelplex.io/role": "replica"}
    await main.on_replica_pod_event(namespace="team-a", labels=labels, memo=memo, type="MODIFIED", body={}, **indexes())
    await main.on_replica_pod_event(namespace="team-a", labels={}, memo=memo, type="MODIFIED", body={}, **indexes())
    assert memo[MEMO_KEY].keeper.pokes == [(("team-a", "recs"), False)]  # a pod of no deployment: nothing


async def test_a_deleted_deployment_is_repaired_and_a_changed_one_only_refreshes_the_status(memo):
    labels = {"modelplex.io/deployment": "recs"}
    for event in ("ADDED", "MODIFIED", "DELETED"):
        await main.on_deployment_event(type=event, namespace="team-a", labels=labels, memo=memo, body={}, **indexes())
    assert memo[MEMO_KEY].keeper.pokes == [(("team-a", "recs"), False), (("team-a", "recs"), False),
                                           (("team-a", "recs"), True)]


async def test_reconcile_applies_the_objects_and_refreshes_the_status(memo, api, posted):
    await main.reconcile_resource(body=kopf.Body(body()), memo=memo, retry=0, **indexes())
    operator = memo[MEMO_KEY]
    assert operator.context.outcomes[("team-a", "recs")].state == OK
    assert operator.keeper.pokes == [(("team-a", "recs"), False)]
    assert {"Deployment", "Service", "ConfigMap"} <= {r.body["kind"] for r in api.writes()}
    assert ("Normal", "Created") in posted


async def test_an_invalid_spec_is_a_permanent_error_with_its_reason(memo, api, posted):
    with pytest.raises(kopf.PermanentError, match="invalid spec"):
        await main.reconcile_resource(body=kopf.Body(body(replicas=-1)), memo=memo, retry=0, **indexes())
    assert memo[MEMO_KEY].context.outcomes[("team-a", "recs")].state == INVALID
    assert memo[MEMO_KEY].keeper.pokes == [(("team-a", "recs"), False)]  # the status says it too
    assert api.writes() == [] and posted == [("Warning", "InvalidSpec")]


def test_settings():
    settings = kopf.OperatorSettings()
    lifecycle.configure_settings(settings)
    assert settings.peering.standalone is True
    assert settings.scanning.disabled is True
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "operator.modelplex.io"
    selectors = {tuple(filter(None, (s.group, s.version, s.plural or s.any_name))): v
                 for s, v in settings.watching.label_selectors.items()}
    assert selectors[("v1", "pods")] == "app.kubernetes.io/managed-by=modelplex-operator,modelplex.io/role=replica"
    assert selectors[("apps", "v1", "deployments")] == "app.kubernetes.io/managed-by=modelplex-operator"


def test_bad_settings_exit_with_2(monkeypatch, capsys):
    monkeypatch.setenv("MODELPLEX_LOG_LEVEL", "loud")
    assert main.run_operator() == 2
    assert "MODELPLEX_LOG_LEVEL" in capsys.readouterr().err
