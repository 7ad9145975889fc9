"""The client's pure parts: paths, ownership, which errors are worth a retry."""

from __future__ import annotations

import json

import pytest

from modelplex.wire.names import LABEL_DEPLOYMENT
from modelplex_operator import builders
from modelplex_operator.kube import (
    KubeError,
    NotOwned,
    check_ownership,
    controller_of,
    error_from_api_exception,
    object_path,
)
from unit.operator.objects import UID, body, deployment_of


def test_object_paths():
    assert object_path("v1", "ConfigMap", "ns", "c") == "/api/v1/namespaces/ns/configmaps/c"
    assert object_path("apps/v1", "Deployment", "ns", "d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert object_path("rbac.authorization.k8s.io/v1", "RoleBinding", "ns", "r") == \
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings/r"
    assert object_path("modelplex.io/v1alpha1", "MultiplexedDeployment", "ns", "m", "status") == \
        "/apis/modelplex.io/v1alpha1/namespaces/ns/multiplexeddeployments/m/status"
    assert object_path("v1", "Secret", "ns", "modelplex-internal") == "/api/v1/namespaces/ns/secrets/modelplex-internal"
    with pytest.raises(ValueError, match="does not write Node"):
        object_path("v1", "Node", "ns", "n")


def _owned_by(uid, controller=True):
    return {"metadata": {"ownerReferences": [
        {"kind": "Other", "name": "x", "uid": "someone", "controller": False},
        {"kind": "MultiplexedDeployment", "name": "recs", "uid": uid, "controller": controller},
    ]}}


def test_ownership():
    desired = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "modelplex-operator"}}}
    assert controller_of(_owned_by("u1"))["uid"] == "u1"
    assert controller_of(_owned_by("u1", controller=False)) is None
    check_ownership(None, desired, "u1", "Deployment d")  # new
    check_ownership(_owned_by("u1"), desired, "u1", "Deployment d")  # ours
    with pytest.raises(NotOwned, match="Deployment d exists and is controlled by MultiplexedDeployment recs"):
        check_ownership(_owned_by("u0"), desired, "u1", "Deployment d")


def _same_name(obj: dict, labels: dict | None) -> dict:
    """What the API answers for an object of ``obj``'s kind and name that has no controller."""
    meta = {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"], "resourceVersion": "5"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta}


@pytest.mark.parametrize("obj", builders.desired_objects(deployment_of(body()), builders.owner_reference(body())),
                         ids=lambda obj: f"{obj['kind']}-{obj['metadata']['name']}")
def test_an_object_of_any_kind_is_adopted_only_with_the_operator_s_labels(obj):
    what = builders.describe(obj)
    for stranger in (_same_name(obj, None), _same_name(obj, {"team": "theirs"}),
                     _same_name(obj, {**obj["metadata"]["labels"], "app.kubernetes.io/managed-by": "Helm"}),
                     _same_name(obj, {**obj["metadata"]["labels"], LABEL_DEPLOYMENT: "another"})):
        with pytest.raises(NotOwned, match=f"{what} exists and was not made by Modelplex: left as it is") as caught:
            check_ownership(stranger, obj, UID, what)
        assert "app.kubernetes.io/managed-by=modelplex-operator, modelplex.io/deployment=recs to hand it over" in \
            str(caught.value)
    # Made by an earlier operator (its labels, no controller): adopted.
    check_ownership(_same_name(obj, dict(obj["metadata"]["labels"])), obj, UID, what)


def test_retryable_errors():
    for status in (0, 403, 408, 409, 429, 500, 503, 504, 599):
        assert KubeError(status, "r", "m").retryable
    for status in (400, 401, 404, 410, 422):
        assert not KubeError(status, "r", "m").retryable


class FakeApiException(Exception):
    def __init__(self, status, reason, body):
        self.status, self.reason, self.body = status, reason, body


def test_api_errors_keep_the_servers_message():
    body = json.dumps({"kind": "Status", "reason": "Invalid",
                       "message": 'Deployment.apps "recs-replica" is invalid: spec.template...: Invalid value'})
    error = error_from_api_exception(FakeApiException(422, "Unprocessable Entity", body), "apply Deployment x")
    assert error.status == 422 and error.reason == "Invalid" and not error.retryable
    assert str(error).startswith("apply Deployment x: 422 Invalid: Deployment.apps \"recs-replica\" is invalid")
    raw = error_from_api_exception(FakeApiException(503, "Service Unavailable", "upstream down"))
    assert raw.message == "upstream down" and raw.retryable
