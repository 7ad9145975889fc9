"""main.py wires every handler to the right resource, cause and filter (kopf's registry)."""

from __future__ import annotations

import kopf

import modelplex_operator.main as main
from modelplex_operator.handlers import lifecycle

CR = ("modelplex.io", "v1alpha1", "multiplexeddeployments")


def _handlers(registry):
    return [h for h in registry.get_all_handlers()]


def _ids(registry):
    return sorted({h.id for h in registry.get_all_handlers()})


def test_handlers_are_registered():
    registry = kopf.get_default_registry()
    assert _ids(registry._indexing) == ["deployments_by_owner", "mxd_by_key", "replica_pods_by_owner"]
    assert _ids(registry._watching) == ["on_deployment_event", "on_replica_pod_event", "on_resource_event"]
    changing = _handlers(registry._changing)
    assert {h.id for h in changing} == {"reconcile_resource"}
    causes = sorted(str(h.reason) for h in changing if h.reason is not None)
    assert len(changing) == 3 and any(h.initial for h in changing)  # create, update, resume
    assert causes and all(h.selector.group == "modelplex.io" for h in changing)
    # No daemons, timers or deletion handlers: kopf adds no finalizer, so deleting a resource
    # never waits for the operator.
    assert not _handlers(registry._spawning)
    assert not any(h.requires_finalizer for h in changing)


def test_filters_select_only_the_operators_objects():
    registry = kopf.get_default_registry()
    pods = next(h for h in registry._watching.get_all_handlers() if h.id == "on_replica_pod_event")
    assert (pods.selector.plural or pods.selector.any_name) == "pods" and pods.selector.version == "v1"
    assert pods.labels == main.REPLICA_PODS
    assert main.REPLICA_PODS["modelplex.io/role"] == "replica"
    assert main.REPLICA_PODS["app.kubernetes.io/managed-by"] == "modelplex-operator"
    deps = next(h for h in registry._watching.get_all_handlers() if h.id == "on_deployment_event")
    assert deps.selector.group == "apps" and deps.labels == main.OURS


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
