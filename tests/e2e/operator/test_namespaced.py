"""An operator installed for some namespaces manages those, with Roles there and no ClusterRole.

The session's cluster-wide operator is scaled to 0 for the length of this test (and back).
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from modelplex_cluster.testing import wait_for

from e2e.operator.conftest import OperatorRelease, helm
from e2e.operator.helpers import CHART, READY_TIMEOUT, get_mxd, kubectl_apply, manifest, owned, wait_settled

pytestmark = pytest.mark.e2e


def _scale_operator(cp, api, op: OperatorRelease, replicas: int) -> None:
    cp.kubectl("scale", "deployment", op.deployment, "-n", op.namespace, f"--replicas={replicas}")
    if replicas:
        op.wait_ready(api)
    else:
        wait_for(lambda: not client.CoreV1Api(api).list_namespaced_pod(
            op.namespace, label_selector=f"app.kubernetes.io/instance={op.release}").items,
            timeout=READY_TIMEOUT, what="the session's operator pod gone")


def test_watching_one_namespace(control_plane, modelplex_operator, kube_namespace, api):
    watched, other = kube_namespace, f"e2e-other-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    release, release_ns = "scoped", f"modelplex-scoped-{uuid.uuid4().hex[:6]}"
    _scale_operator(control_plane, api, modelplex_operator, 0)
    try:
        helm(control_plane, "install", release, str(CHART), "--namespace", release_ns, "--create-namespace",
             "--wait", "--timeout", f"{READY_TIMEOUT}s", "--set", f"watchNamespaces={{{watched}}}")
        scoped = OperatorRelease(release, release_ns, deployment="scoped-modelplex")
        scoped.wait_ready(api)
        sa = f"system:serviceaccount:{release_ns}:scoped-modelplex"
        for verb, resource, ns, allowed in (("create", "deployments", watched, "yes"),
                                            ("create", "deployments", other, "no"),
                                            ("list", "pods", other, "no"),
                                            ("list", "secrets", watched, "no")):
            answer = control_plane.kubectl("auth", "can-i", verb, resource, "-n", ns, "--as", sa, check=False)
            assert answer.stdout.strip() == allowed, (verb, resource, ns, answer.stdout, answer.stderr)
        # Roles only: the release made no ClusterRole or ClusterRoleBinding, and its account holds no
        # cluster-wide right (it cannot even list its own resources across namespaces).
        rbac = client.RbacAuthorizationV1Api(api)
        mine = f"app.kubernetes.io/instance={release}"
        assert not rbac.list_cluster_role(label_selector=mine).items
        assert not rbac.list_cluster_role_binding(label_selector=mine).items
        assert [r.metadata.namespace for r in rbac.list_role_for_all_namespaces(label_selector=mine).items] == [watched]
        for verb, resource in (("list", "multiplexeddeployments.modelplex.io"), ("list", "pods"),
                               ("list", "customresourcedefinitions"), ("list", "namespaces")):
            answer = control_plane.kubectl("auth", "can-i", verb, resource, "--all-namespaces", "--as", sa, check=False)
            assert answer.stdout.strip() == "no", (verb, resource, answer.stdout)

        kubectl_apply(control_plane, other, manifest("elsewhere", replicas=1))
        kubectl_apply(control_plane, watched, manifest("here", replicas=1))
        wait_settled(api, watched, "here", replicas=1)
        # The other namespace's resource is not this operator's business.
        assert not (get_mxd(api, other, "elsewhere").get("status") or {})
        assert not any(owned(api, other, "elsewhere").values())
        helm(control_plane, "uninstall", release, "--namespace", release_ns, "--wait", "--timeout", "120s")
        # The cluster-wide operator, back, takes the other namespace's resource.
        _scale_operator(control_plane, api, modelplex_operator, 1)
        wait_settled(api, other, "elsewhere", replicas=1)
    finally:
        _scale_operator(control_plane, api, modelplex_operator, 1)
        for ns in (other, release_ns):
            try:
                core.delete_namespace(ns)
            except client.ApiException:
                pass
