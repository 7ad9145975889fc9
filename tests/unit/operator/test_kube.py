"""The client's pure parts: paths, ownership, which errors are worth a retry."""

from __future__ import annotations

import copy
import json

import pytest
from unit.operator.objects import UID, body, deployment_of

from modelplex.wire.names import LABEL_DEPLOYMENT
from modelplex_operator import builders
from modelplex_operator.applied import ANNOTATION_APPLIED, applied_hash, with_applied_hash
from modelplex_operator.kube import (KubeError, NotOwned, check_ownership, controller_of, error_from_api_exception,
                                     object_path)


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


# --------------------------------------------------------------------------- apply: as few calls as the state allows

OWNER = "u1"
CREATE = ("POST", "/api/v1/namespaces/ns/configmaps?fieldManager=modelplex-operator")
READ = ("GET", "/api/v1/namespaces/ns/configmaps/c")
APPLY = ("PATCH", "/api/v1/namespaces/ns/configmaps/c?fieldManager=modelplex-operator&force=true")
ADOPT = ("PATCH", "/api/v1/namespaces/ns/configmaps/c?fieldManager=modelplex-operator")


def desired(**data) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": data, "metadata": {
        "name": "c", "namespace": "ns", "labels": {"app.kubernetes.io/managed-by": "modelplex-operator"},
        "ownerReferences": [{"kind": "MultiplexedDeployment", "name": "recs", "uid": OWNER, "controller": True}]}}


def served(obj: dict, version: str = "3", managed: list | None = None) -> dict:
    """``obj`` as the API answers it once applied (with the hash the operator stamps on it)."""
    doc = copy.deepcopy(with_applied_hash(obj))
    doc["metadata"].update(resourceVersion=version, uid="cm-uid", managedFields=managed or [
        {"manager": "modelplex-operator", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1"}])
    return doc


def calls(api) -> list[tuple[str, str]]:
    return [(request.method, request.path) for request in api.requests]


def test_a_new_object_is_one_create_carrying_the_applied_hash(api):
    kube = api.kube()
    result = kube.apply(desired(a="1"), OWNER)
    assert result.action == "created" and result.before is None
    assert calls(api) == [CREATE]
    sent = api.requests[0].body
    assert sent["data"] == {"a": "1"}
    assert sent["metadata"]["annotations"][ANNOTATION_APPLIED] == applied_hash(desired(a="1"))


def test_an_existing_object_in_step_is_read_and_not_written(api):
    kube = api.kube()
    api.answers = [(409, "exists"), (200, served(desired(a="1")))]
    assert kube.apply(desired(a="1"), OWNER).action == "unchanged"
    assert calls(api) == [CREATE, READ]
    api.reset()
    api.answers = [(200, served(desired(a="1")))]
    assert kube.apply(desired(a="1"), OWNER).action == "unchanged"  # known to exist: read first
    assert calls(api) == [READ]


def test_an_existing_object_out_of_step_is_applied(api):
    kube = api.kube()
    api.answers = [(409, "exists"), (200, served(desired(a="0"))), (200, served(desired(a="1"), version="4"))]
    result = kube.apply(desired(a="1"), OWNER)
    assert result.action == "updated" and result.before["data"] == {"a": "0"}
    assert calls(api) == [CREATE, READ, APPLY]
    assert api.requests[-1].body["metadata"]["annotations"][ANNOTATION_APPLIED] == applied_hash(desired(a="1"))


def test_an_object_a_create_made_hands_its_fields_to_the_apply_once(api):
    kube = api.kube()
    created = served(desired(a="0"), managed=[
        {"manager": "modelplex-operator", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1"}])
    api.answers = [(409, "exists"), (200, created), (200, served(desired(a="0"), version="4")),
                   (200, served(desired(a="1"), version="5"))]
    assert kube.apply(desired(a="1"), OWNER).action == "updated"
    assert calls(api) == [CREATE, READ, ADOPT, APPLY]
    assert api.requests[2].body[-1] == {"op": "replace", "path": "/metadata/managedFields/0/operation",
                                        "value": "Apply"}


def test_a_same_named_object_the_operator_did_not_make_is_read_and_never_written(api):
    kube = api.kube()
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "theirs"},
              "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "2", "labels": {"team": "theirs"}}}
    for _ in range(2):  # refused the first time and the next
        api.reset()
        api.answers = [(409, "exists"), (200, theirs)]
        with pytest.raises(NotOwned, match="ConfigMap c exists and was not made by Modelplex"):
            kube.apply(desired(a="1"), OWNER)
        assert calls(api) == [CREATE, READ]  # the create was refused (409): nothing written


def test_an_object_deleted_after_it_was_seen_is_applied_again(api):
    kube = api.kube()
    kube.apply(desired(a="1"), OWNER)  # created: now known
    api.reset()
    result = kube.apply(desired(a="1"), OWNER)  # the read finds nothing (404): applied anew
    assert result.action == "created" and calls(api) == [READ, APPLY]


def test_an_adoption_whose_entries_moved_reads_again_and_retries(api):
    kube = api.kube()
    update = {"manager": "modelplex-operator", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1"}
    status = {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
              "fieldsType": "FieldsV1", "subresource": "status"}
    api.answers = [(409, "exists"), (200, served(desired(a="0"), managed=[update])),
                   (422, "the test operation failed"),  # the controller-manager's entry came first since
                   (200, served(desired(a="0"), managed=[status, update])),
                   (200, served(desired(a="0"), version="5")),
                   (200, served(desired(a="1"), version="6"))]
    assert kube.apply(desired(a="1"), OWNER).action == "updated"
    assert calls(api) == [CREATE, READ, ADOPT, READ, ADOPT, APPLY]
    assert api.requests[-2].body[-1]["path"] == "/metadata/managedFields/1/operation"


def test_an_object_in_step_is_not_written_even_to_adopt_the_create_s_fields(api):
    """A restarted operator finds what it created before (an Update entry): nothing to change, no write."""
    kube = api.kube()
    update = {"manager": "modelplex-operator", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1"}
    api.answers = [(409, "exists"), (200, served(desired(a="1"), managed=[update]))]
    assert kube.apply(desired(a="1"), OWNER).action == "unchanged"
    assert calls(api) == [CREATE, READ]


def test_an_adoption_that_keeps_failing_is_left_for_the_next_apply(api):
    kube = api.kube()
    update = {"manager": "modelplex-operator", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1"}
    moved = served(desired(a="0"), managed=[update])
    api.answers = [(409, "exists"), (200, moved), *[(422, "moved"), (200, moved)] * 3,
                   (200, served(desired(a="1"), version="9"))]
    assert kube.apply(desired(a="1"), OWNER).action == "updated"
    assert calls(api) == [CREATE, READ, *[ADOPT, READ] * 3, APPLY]
