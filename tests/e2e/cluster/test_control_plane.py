"""The control plane itself: the API, kubectl, RBAC, CRDs."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from modelplex_cluster.testing import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


def versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "hack" / "control-plane" / "versions.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


# --------------------------------------------------------------------------- API and kubectl


def test_kubectl_talks_to_the_cluster(control_plane):
    out = control_plane.kubectl("get", "ns").stdout
    assert "default" in out.split()
    assert "kube-system" in out

    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    expected = "v" + versions()["KUBERNETES_VERSION"]
    assert version["serverVersion"]["gitVersion"] == expected
    assert version["clientVersion"]["gitVersion"] == expected
    # the kubectl used is the one we built, not whatever is on the machine
    assert Path(control_plane.bin_dir, "kubectl").is_file()
    assert control_plane.env()["PATH"].split(os.pathsep)[0] == str(control_plane.bin_dir)


def test_rbac_is_enforced_for_unprivileged_users(control_plane, kube_namespace):
    # impersonating a user with no bindings: forbidden (RBAC is real, not AlwaysAllow)
    proc = control_plane.kubectl("get", "pods", "-n", kube_namespace, "--as=nobody", check=False)
    assert proc.returncode != 0
    assert "forbidden" in proc.stderr.lower()
    assert control_plane.kubectl("auth", "can-i", "create", "pods", "--as=nobody",
                                 check=False).stdout.strip() == "no"
    assert control_plane.kubectl("auth", "can-i", "create", "pods").stdout.strip() == "yes"


def test_crd_and_custom_objects(control_plane, kube_namespace):
    group = f"e2e{uuid.uuid4().hex[:6]}.modelplex.io"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object", "required": ["size"],
                        "properties": {"size": {"type": "integer", "minimum": 1}, "color": {"type": "string"}},
                    }, "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }},
            }],
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd))
    try:
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s")
        api = client.CustomObjectsApi(control_plane.api_client())
        wait_for(lambda: api.list_namespaced_custom_object(group, "v1", kube_namespace, "widgets") is not None,
                 what="the widgets endpoint")
        body = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w1"},
                "spec": {"size": 3, "color": "blue"}}
        api.create_namespaced_custom_object(group, "v1", kube_namespace, "widgets", body)
        got = api.get_namespaced_custom_object(group, "v1", kube_namespace, "widgets", "w1")
        assert got["spec"] == {"size": 3, "color": "blue"}
        assert got["metadata"]["uid"]

        api.patch_namespaced_custom_object_status(group, "v1", kube_namespace, "widgets", "w1",
                                                  {"status": {"seen": True}})
        assert api.get_namespaced_custom_object(group, "v1", kube_namespace, "widgets", "w1")["status"] == {
            "seen": True}

        # the OpenAPI schema is enforced by the real apiserver
        bad = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"size": 0}}
        with pytest.raises(client.ApiException) as err:
            api.create_namespaced_custom_object(group, "v1", kube_namespace, "widgets", bad)
        assert err.value.status == 422

        listed = control_plane.kubectl("get", "wdg", "-n", kube_namespace, "-o", "name").stdout
        assert f"widget.{group}/w1" in listed
    finally:
        control_plane.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)
