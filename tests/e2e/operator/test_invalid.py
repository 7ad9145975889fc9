"""Invalid resources are refused with a message that says what is wrong.

What the CRD's schema can say, the apiserver refuses (kubectl prints its message). What it
cannot, the operator refuses: a ``Degraded`` condition and a Warning Event, and no objects.
"""

from __future__ import annotations

import pytest
import yaml

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import (OWNED_KINDS, REPO, condition, events_of, get_mxd, kubectl_apply, manifest, owned,
                                  wait_event)

pytestmark = pytest.mark.e2e


def _without_image():
    doc = manifest("noimage")
    del doc["spec"]["image"]
    return doc


@pytest.mark.parametrize(
    "doc, expected",
    [
        (manifest("negative", replicas=-1), "spec.replicas: Invalid value: -1"),
        (_without_image(), "spec.image: Required value"),
        (manifest("nobatch", batching={"maxBatchSize": 0}),
         "spec.batching.maxBatchSize: Invalid value: 0: spec.batching.maxBatchSize in body should be greater than or "
         "equal to 1"),
        (manifest("unknown", maxBatchSize=8), 'unknown field "spec.maxBatchSize"'),
        (manifest("badhandler", handler="not a handler"), "spec.handler in body should match"),
        (manifest("nomodelid", modelSource={"uri": "s3://models/model.pt"}), "spec.modelSource.uri"),
        (manifest("badgpu", resources={"limits": {"nvidia.com/gpu": "lots"}}), "spec.resources.limits.nvidia.com/gpu"),
        (manifest("nomodule", modelSource={"uri": "s3://models/{model_id}.safetensors", "format": "safetensors"}),
         "module is required with format: safetensors"),
        (manifest("tsmodule", modelSource={"uri": "s3://models/{model_id}.pt", "module": "nets:Mlp"}),
         "module goes with format: safetensors only"),
    ],
    ids=["negative-replicas", "missing-image", "max-batch-size-0", "unknown-field", "handler-pattern",
         "uri-without-model-id", "bad-quantity", "safetensors-without-module", "module-with-torchscript"],
)
def test_the_schema_refuses(control_plane, modelplex_operator, kube_namespace, api, doc, expected):
    proc = kubectl_apply(control_plane, kube_namespace, doc, check=False)
    assert proc.returncode != 0, proc.stdout
    assert expected in proc.stderr, proc.stderr
    listed = control_plane.kubectl("get", "mxd", "-n", kube_namespace, "-o", "name").stdout
    assert doc["metadata"]["name"] not in listed


@pytest.mark.parametrize(
    "name, spec, expected",
    [
        ("ftp-source", {"modelSource": {"uri": "ftp://models/{model_id}.pt"}},
         "spec.modelSource.uri: scheme must be one of file, http, https, s3 (got 'ftp')"),
        ("a" * 51, {}, "metadata.name: must be a DNS label of at most 50 characters"),
    ],
    ids=["unknown-uri-scheme", "name-too-long"],
)
def test_the_operator_refuses_with_a_condition_and_an_event(
        control_plane, modelplex_operator, kube_namespace, api, name, spec, expected):
    ns = kube_namespace
    kubectl_apply(control_plane, ns, manifest(name, **spec))  # the apiserver accepts it

    def refused():
        obj = get_mxd(api, ns, name)
        degraded = condition(obj, "Degraded")
        done = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
        return done and degraded.get("status") == "True" and obj

    obj = wait_for(refused, timeout=120, what=f"{ns}/{name} refused by the operator")
    degraded, ready = condition(obj, "Degraded"), condition(obj, "Ready")
    assert degraded["reason"] == "InvalidSpec" and expected in degraded["message"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert condition(obj, "Progressing")["status"] == "False"
    etype, _, message = wait_event(api, ns, name, "InvalidSpec")
    assert etype == "Warning" and expected in message
    assert not any(owned(api, ns, name)[kind] for kind in OWNED_KINDS)

    if len(name) > 50:
        return
    # Fixed, it is reconciled: the operator acts on the next generation.
    kubectl_apply(control_plane, ns, manifest(name, replicas=0, modelSource={"uri": "s3://models/{model_id}.pt"}))

    def fixed():
        obj = get_mxd(api, ns, name)
        done = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
        return done and condition(obj, "Degraded").get("status") == "False" and obj

    obj = wait_for(fixed, timeout=120, what=f"{ns}/{name} reconciled once fixed")
    assert condition(obj, "Ready")["reason"] == "ScaledToZero"
    assert all(owned(api, ns, name)[kind] for kind in OWNED_KINDS)
    assert [e for e in events_of(api, ns, name) if e[1] == "Created"]


def test_the_example_manifests_pass_the_schema(control_plane, modelplex_operator, kube_namespace):
    examples = REPO / "examples" / "operator"
    proc = control_plane.kubectl("apply", "--dry-run=server", "-n", kube_namespace, "-f", str(examples))
    for path in sorted(examples.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        assert f"multiplexeddeployment.modelplex.io/{name} created (server dry run)" in proc.stdout, proc.stdout


def test_an_object_the_api_refuses_is_reported_and_not_retried(control_plane, modelplex_operator, kube_namespace,
                                                               api):
    # Neither the schema nor modelplex.wire.spec check environment variable names; the apiserver
    # refuses the Deployment that carries one it cannot take. The operator says so and stops.
    ns, name = kube_namespace, "badenv"
    kubectl_apply(control_plane, ns, manifest(name, env=[{"name": "NOT=VALID", "value": "x"}]))

    def rejected():
        obj = get_mxd(api, ns, name)
        done = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
        return done and condition(obj, "Degraded").get("reason") == "ApplyRejected" and obj

    obj = wait_for(rejected, timeout=120, what=f"{ns}/{name} rejected")
    message = condition(obj, "Degraded")["message"]
    assert "Deployment" in message and "422" in message and "env[" in message and "NOT=VALID" in message
    assert condition(obj, "Ready")["reason"] == "ApplyRejected"
    assert condition(obj, "Progressing")["status"] == "False"
    etype, _, event_message = wait_event(api, ns, name, "ApplyRejected")
    assert etype == "Warning" and "NOT=VALID" in event_message
    assert owned(api, ns, name)["Deployment"] == []
