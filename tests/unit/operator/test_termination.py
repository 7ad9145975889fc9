"""Pods stop gracefully: a preStop wait, the spec's drain, and disruption budgets for both roles."""

from __future__ import annotations

from pathlib import Path

import yaml
from unit.operator.objects import body, deployment_of

from modelplex_operator import builders
from modelplex_operator.builders import PRE_STOP_S, BuildSettings
from modelplex_operator.kube import object_path


def objects(**spec):
    doc = body(**spec)
    return {(o["kind"], o["metadata"]["name"]): o
            for o in builders.desired_objects(deployment_of(doc), builders.owner_reference(doc), BuildSettings())}


def pod(objs, role):
    return objs[("Deployment", f"recs-{role}")]["spec"]["template"]["spec"]


def test_both_roles_wait_before_sigterm_then_drain_within_the_spec_grace():
    for grace, expected in ((None, 20), (45, 45), (2.5, 3)):
        objs = objects() if grace is None else objects(gracefulShutdownTimeoutSeconds=grace)
        for role in ("replica", "router"):
            spec = pod(objs, role)
            (container,) = spec["containers"]
            assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": PRE_STOP_S}}}
            # The kubelet's clock covers the preStop wait and the drain; the margin lets the
            # process cancel what is left and exit before SIGKILL.
            assert PRE_STOP_S + expected < spec["terminationGracePeriodSeconds"] <= PRE_STOP_S + expected + 10


def test_a_zero_grace_stops_at_once():
    objs = objects(gracefulShutdownTimeoutSeconds=0)
    for role in ("replica", "router"):
        spec = pod(objs, role)
        assert "lifecycle" not in spec["containers"][0]
        assert spec["terminationGracePeriodSeconds"] <= 10


def test_a_disruption_budget_per_role_selects_exactly_its_pods():
    objs = objects()
    for role in ("replica", "router"):
        budget = objs[("PodDisruptionBudget", f"recs-{role}")]
        assert budget["apiVersion"] == "policy/v1"
        # maxUnavailable, not minAvailable: a one-pod deployment can still be drained.
        assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
        deployment = objs[("Deployment", f"recs-{role}")]
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
        assert budget["metadata"]["ownerReferences"] == deployment["metadata"]["ownerReferences"]
        assert object_path(budget["apiVersion"], budget["kind"], "team-a", budget["metadata"]["name"]) == \
            f"/apis/policy/v1/namespaces/team-a/poddisruptionbudgets/recs-{role}"


def test_routers_default_to_two_pods():
    doc = body()
    del doc["spec"]["router"]["replicas"]
    objs = {(o["kind"], o["metadata"]["name"]): o
            for o in builders.desired_objects(deployment_of(doc), builders.owner_reference(doc), BuildSettings())}
    assert objs[("Deployment", "recs-router")]["spec"]["replicas"] == 2


def test_the_chart_lets_the_operator_write_disruption_budgets():
    # The operator's rules (its ClusterRole's, or each watched namespace's Role's) are one template.
    text = (Path(__file__).parents[3] / "charts/modelplex/templates/_helpers.tpl").read_text()
    rules = yaml.safe_load(text.split('define "modelplex.operatorRules" -}}', 1)[1].split("{{-", 1)[0])
    assert {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"],
            "verbs": ["get", "create", "patch"]} in rules
