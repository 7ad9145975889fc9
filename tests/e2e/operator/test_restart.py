"""The operator restarted in the middle of a reconcile ends in the right state, nothing doubled.

To stop a reconcile halfway on purpose, the test takes from the operator's ClusterRole the
right to write Deployments: the operator applies the ServiceAccounts, Roles, RoleBindings,
ConfigMap and Service, then the API answers 403 for the first Deployment and the operator
retries with a growing delay (``Degraded``/``ApplyFailed`` meanwhile). The test then deletes
the operator pod (its Deployment starts a new one), gives the right back, and checks the end
state: Ready, every object exactly once, one owner each, one ReplicaSet per Deployment.
A second restart of a settled resource (SIGKILL of the operator's process) changes nothing.
"""

from __future__ import annotations

import copy
import os
import signal

import pytest
from kubernetes import client

from modelplex_cluster.testing import pid_alive, wait_for

from e2e.operator.helpers import (OWNED_KINDS, READY_TIMEOUT, condition, expected_objects, get_mxd, kubectl_apply,
                                  manifest, owned, wait_settled)

pytestmark = pytest.mark.e2e


def _without_deployment_writes(rules):
    out = copy.deepcopy(rules)
    for rule in out:
        if "deployments" in (rule.resources or []):
            rule.verbs = [v for v in rule.verbs if v not in ("create", "patch", "update")]
    return out


def test_restart_in_the_middle_of_a_reconcile(control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "restart"
    rbac = client.RbacAuthorizationV1Api(api)
    core = client.CoreV1Api(api)
    role_name = modelplex_operator.deployment
    original = rbac.read_cluster_role(role_name)
    crippled = rbac.read_cluster_role(role_name)
    crippled.rules = _without_deployment_writes(crippled.rules)
    rbac.replace_cluster_role(role_name, crippled)
    try:
        kubectl_apply(control_plane, ns, manifest(name, replicas=2))

        # Halfway: what comes before the Deployments exists, the Deployments do not.
        def stuck():
            obj = get_mxd(api, ns, name)
            degraded = condition(obj, "Degraded")
            return degraded.get("reason") == "ApplyFailed" and obj

        obj = wait_for(stuck, timeout=120, what="the reconcile to stop at the Deployments (403)")
        assert "403" in condition(obj, "Degraded")["message"] and "Deployment" in condition(obj, "Degraded")["message"]
        assert condition(obj, "Ready")["status"] == "False"
        partial = owned(api, ns, name)
        for kind in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service"):
            assert partial[kind] == expected_objects(name)[kind], (kind, partial)
        assert partial["Deployment"] == []

        # Restart the operator in the middle of it.
        old_pod = modelplex_operator.pod(api)
        core.delete_namespaced_pod(old_pod.metadata.name, modelplex_operator.namespace)
        wait_for(lambda: (p := modelplex_operator.pod(api)) is not None and p.metadata.uid != old_pod.metadata.uid,
                 timeout=READY_TIMEOUT, what="a new operator pod")
    finally:
        restored = rbac.read_cluster_role(role_name)
        restored.rules = original.rules
        rbac.replace_cluster_role(role_name, restored)
    modelplex_operator.wait_ready(api)

    obj = wait_settled(api, ns, name, replicas=2)
    after = owned(api, ns, name)
    for kind in OWNED_KINDS:
        assert after[kind] == expected_objects(name)[kind], (kind, after)
    assert len(after["ReplicaSet"]) == 2  # one per Deployment: no template churn
    assert len(after["Pod"]) == 2 + 2  # 2 replicas, and the default 2 routers
    uid = obj["metadata"]["uid"]
    apps = client.AppsV1Api(api)
    for dep_name in (f"{name}-replica", f"{name}-router"):
        refs = apps.read_namespaced_deployment(dep_name, ns).metadata.owner_references
        assert [(r.uid, r.controller) for r in refs] == [(uid, True)]
    for sa in after["ServiceAccount"]:
        refs = core.read_namespaced_service_account(sa, ns).metadata.owner_references
        assert [r.uid for r in refs] == [uid]

    # A crash (SIGKILL, no goodbye) of a settled operator changes nothing either.
    versions = {d: apps.read_namespaced_deployment(d, ns).metadata.resource_version
                for d in (f"{name}-replica", f"{name}-router")}
    generation = obj["metadata"]["generation"]
    pod = modelplex_operator.pod(api)
    (status,) = pod.status.container_statuses
    pid = control_plane.container_pid(status.container_id)
    restarts = status.restart_count
    os.kill(pid, signal.SIGKILL)  # from the host: the container's init ignores it from inside
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the operator process gone")

    def restarted():
        p = modelplex_operator.pod(api)
        st = p.status.container_statuses[0] if p and p.status.container_statuses else None
        ready = p and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
        return st is not None and st.restart_count > restarts and ready

    wait_for(restarted, timeout=READY_TIMEOUT, what="the operator container restarted and ready")

    # The restarted operator (`kubectl logs` shows the new container) resumes the resource,
    # finds everything in place, changes nothing.
    resumed = f"{ns}/{name}: reconciled generation {generation}: nothing changed"

    def resumed_log():
        return resumed in control_plane.pod_log(modelplex_operator.namespace, pod.metadata.name)

    wait_for(resumed_log, timeout=120, what=f"the restarted operator's log to say {resumed!r}")
    obj = wait_settled(api, ns, name, replicas=2)
    assert obj["metadata"]["generation"] == generation
    assert owned(api, ns, name) == after
    for dep_name, version in versions.items():
        assert apps.read_namespaced_deployment(dep_name, ns).metadata.resource_version == version
