"""The Helm chart: lint-clean, and it renders the operator with least-privilege RBAC.

Uses the helm the control-plane script builds (no cluster needed for these).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from modelplex_cluster.controlplane import build_binaries
from modelplex_operator import builders
from modelplex_operator.builders import ROLE_RULES

from e2e.operator.helpers import CHART, CRD

pytestmark = pytest.mark.e2e
KUBE_VERSION = "1.33.0"


@pytest.fixture(scope="module")
def helm_bin():
    return build_binaries(quiet=True) / "helm"


def helm(helm_bin, *args, check=True):
    proc = subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def render(helm_bin, *sets: str) -> list[dict]:
    args = ["template", "mx", str(CHART), "--namespace", "ops", "--kube-version", KUBE_VERSION, "--include-crds"]
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(helm(helm_bin, *args).stdout) if doc]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("sets", [[], ["watchNamespaces={team-a,team-b}"], ["serviceAccount.create=false"],
                                  ["replicaPodPolicy.enabled=false"]])
def test_lint_is_clean(helm_bin, sets):
    args = ["lint", str(CHART), "--strict"]
    for item in sets:
        args += ["--set", item]
    proc = helm(helm_bin, *args)
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_the_chart_installs_the_one_crd(helm_bin):
    (crd,) = by_kind(render(helm_bin), "CustomResourceDefinition")
    assert crd == yaml.safe_load(CRD.read_text())
    assert (CHART / "crds" / CRD.name).read_bytes() == CRD.read_bytes()


def test_operator_deployment(helm_bin):
    docs = render(helm_bin, "routerImage.repository=reg.example.com/router", "routerImage.tag=9",
                  "logLevel=warning")
    (dep,) = by_kind(docs, "Deployment")
    assert dep["metadata"]["namespace"] == "ops"
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["modelplex", "operator"]
    assert c["image"] == "modelplex/operator:0.1.0"
    env = [e["name"] for e in c["env"]]
    values = {e["name"]: e.get("value") for e in c["env"]}
    assert values["MODELPLEX_ROUTER_IMAGE"] == "reg.example.com/router:9"
    assert values["MODELPLEX_WATCH_NAMESPACES"] == ""
    assert values["MODELPLEX_LOG_LEVEL"] == "warning"
    # $(POD_IP) expands only from a variable defined before it.
    assert values["MODELPLEX_OPERATOR_HEALTH"] == "http://$(POD_IP):8080/healthz"
    assert env.index("POD_IP") < env.index("MODELPLEX_OPERATOR_HEALTH")
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    (sa,) = by_kind(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":
            labels = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == "mx"
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["helm.sh/chart"] == "modelplex-0.1.0"


def _verbs(rules, group, resource):
    return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


def test_rbac_is_least_privilege(helm_bin):
    docs = render(helm_bin)
    (role,) = by_kind(docs, "ClusterRole")
    rules = role["rules"]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        # One delete: the InferencePool the operator made, once spec.router.endpointPicker is off.
        allowed = {"delete"} if rule["resources"] == ["inferencepools"] else set()
        assert not ({"delete", "deletecollection", "escalate", "bind", "impersonate"} - allowed) & set(rule["verbs"])
    # Secrets: each deployment's internal credential made, read back and patched; never listed or watched.
    assert _verbs(rules, "", "secrets") == {"create", "get", "patch"}
    assert _verbs(rules, "networking.k8s.io", "networkpolicies") == {"get", "create", "patch"}
    assert _verbs(rules, "modelplex.io", "multiplexeddeployments") == {"get", "list", "watch", "patch"}
    assert _verbs(rules, "modelplex.io", "multiplexeddeployments/status") == {"get", "patch"}
    assert _verbs(rules, "apps", "deployments") == {"get", "list", "watch", "create", "patch"}
    for resource in ("services", "serviceaccounts", "configmaps"):
        assert _verbs(rules, "", resource) == {"get", "create", "patch"}, resource
    for resource in ("roles", "rolebindings"):
        assert _verbs(rules, "rbac.authorization.k8s.io", resource) == {"get", "create", "patch"}, resource
    assert _verbs(rules, "", "events") == {"create"}
    assert _verbs(rules, "inference.networking.k8s.io", "inferencepools") == {"get", "create", "patch", "delete"}
    # RBAC's escalation rule: the operator holds everything the Roles it creates grant.
    for role_rules in ROLE_RULES.values():
        for rule in role_rules:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= _verbs(rules, "", resource)
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mx-modelplex", "namespace": "ops"}]


def test_watching_some_namespaces_installs_roles_there_and_no_cluster_role(helm_bin):
    docs = render(helm_bin, "watchNamespaces={team-a,team-b}")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    (cluster_role,) = by_kind(render(helm_bin), "ClusterRole")
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(r["rules"] == cluster_role["rules"] for r in roles)  # the same rights, only there
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": "mx-modelplex"} for b in bindings)
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": "mx-modelplex", "namespace": "ops"}]
               for b in bindings)
    (dep,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MODELPLEX_WATCH_NAMESPACES"] == "team-a,team-b"
    # The replica pod policy checks requests in the watched namespaces only.
    (binding,) = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]


def test_the_replica_pod_policy_binds_the_operator_s_replica_service_accounts(helm_bin):
    docs = render(helm_bin)
    (policy,) = by_kind(docs, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ServiceAccount"}
    # Its parameters are the ServiceAccounts the operator labels as a replica's.
    selector = binding["spec"]["paramRef"]["selector"]["matchLabels"]
    assert selector.items() <= builders.role_labels("recs", "replica").items()
    assert not selector.items() <= builders.role_labels("recs", "router").items()
    assert binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow"
    assert "matchResources" not in binding["spec"]  # every namespace
    # A refusal is a 403 (Forbidden), not a 422.
    assert {v["reason"] for v in policy["spec"]["validations"]} == {"Forbidden"}
    assert "modelplex.io/loaded-models" in json.dumps(policy["spec"]["validations"])
    off = render(helm_bin, "replicaPodPolicy.enabled=false")
    assert not by_kind(off, "ValidatingAdmissionPolicy") and not by_kind(off, "ValidatingAdmissionPolicyBinding")


def test_bad_values_are_refused_by_the_values_schema(helm_bin):
    proc = subprocess.run(
        [str(helm_bin), "template", "mx", str(CHART), "--kube-version", KUBE_VERSION, "--set", "logLevel=loud"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "logLevel" in proc.stderr
    proc = subprocess.run(
        [str(helm_bin), "template", "mx", str(CHART), "--kube-version", KUBE_VERSION, "--set", "replicaCount=2"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "replicaCount" in proc.stderr


def test_on_a_server_older_than_1_30_the_replica_pod_policy_is_skipped_and_the_notes_say_so(helm_bin, tmp_path):
    args = ["template", "mx", str(CHART), "--namespace", "ops", "--kube-version", "1.29.4"]
    docs = [doc for doc in yaml.safe_load_all(helm(helm_bin, *args).stdout) if doc]
    assert not by_kind(docs, "ValidatingAdmissionPolicy") and not by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert by_kind(docs, "Deployment")  # the rest installs
    old = notes(helm_bin, tmp_path, "1.29.4")
    assert "NOT INSTALLED: the replica pod policy" in old and "v1.29.4" in old
    assert "NOT INSTALLED" not in notes(helm_bin, tmp_path, KUBE_VERSION)


def notes(helm_bin, tmp_path, kube_version: str) -> str:
    """NOTES.txt as ``helm install`` prints it for a server of ``kube_version``: ``helm template``
    skips NOTES.txt and an install needs a server of that version, so a copy of the chart renders
    the same text into a YAML document."""
    chart = tmp_path / f"chart-{kube_version}"
    shutil.copytree(CHART, chart)
    templates = chart / "templates"
    text = (templates / "NOTES.txt").read_text()
    (templates / "NOTES.txt").unlink()
    (templates / "_notes.tpl").write_text('{{- define "notes" -}}\n' + text + "{{- end }}\n")
    (templates / "notes.yaml").write_text('notes: |\n{{ include "notes" . | indent 2 }}\n')
    out = helm(helm_bin, "template", "mx", str(chart), "--namespace", "ops", "--kube-version", kube_version,
               "--show-only", "templates/notes.yaml").stdout
    return yaml.safe_load(out)["notes"]
