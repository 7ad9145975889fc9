"""When an apply can be skipped, and the patch that hands a create's fields to the apply (pure)."""

from __future__ import annotations

import copy

from unit.operator.objects import body, deployment_of

from modelplex_operator import builders
from modelplex_operator.applied import (ANNOTATION_APPLIED, adopt_created, applied_hash, contains, in_step,
                                        with_applied_hash)


def router() -> dict:
    """The router Deployment, as the operator builds it."""
    doc = body()
    objects = builders.desired_objects(deployment_of(doc), builders.owner_reference(doc))
    return next(obj for obj in objects if obj["metadata"]["name"] == "recs-router" and obj["kind"] == "Deployment")


def as_served(obj: dict) -> dict:
    """``obj`` as the API answers it after an apply: the hash, the server's own fields, defaults."""
    served = copy.deepcopy(with_applied_hash(obj))
    served["metadata"].update(resourceVersion="7", uid="u-7", creationTimestamp="2026-11-26T00:00:00Z")
    served["spec"]["progressDeadlineSeconds"] = 600
    served["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    served["status"] = {"replicas": 1}
    return served


def test_an_object_the_server_only_added_defaults_to_is_in_step():
    assert in_step(as_served(router()), router())


def test_a_field_changed_or_removed_by_someone_else_is_out_of_step():
    changed = as_served(router())
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "theirs:1"
    assert not in_step(changed, router())
    removed = as_served(router())
    del removed["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert not in_step(removed, router())


def test_a_field_the_operator_stopped_setting_is_out_of_step_through_the_hash():
    desired = router()
    old = copy.deepcopy(desired)
    old["spec"]["template"]["metadata"]["annotations"]["obsolete"] = "x"
    served = as_served(old)
    assert contains(served, desired)  # every field it sets now is there ...
    assert not in_step(served, desired)  # ... but the object was applied from another desired object


def test_the_hash_leaves_itself_out_and_the_desired_object_untouched():
    desired = router()
    before = copy.deepcopy(desired)
    stamped = with_applied_hash(desired)
    assert desired == before and stamped["metadata"]["annotations"][ANNOTATION_APPLIED] == applied_hash(desired)
    assert applied_hash(stamped) == applied_hash(desired)
    scaled = copy.deepcopy(desired)
    scaled["spec"]["replicas"] += 1
    assert applied_hash(scaled) != applied_hash(desired)


def test_lists_must_match_item_by_item():
    assert contains({"a": [{"x": 1, "y": 2}]}, {"a": [{"x": 1}]})
    assert not contains({"a": [{"x": 1}, {"x": 2}]}, {"a": [{"x": 1}]})
    assert not contains({"a": "1"}, {"a": 1})


def entry(manager: str, operation: str, subresource: str = "") -> dict:
    return {"manager": manager, "operation": operation, "apiVersion": "v1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {}}, **({"subresource": subresource} if subresource else {})}


def served_with(*entries: dict) -> dict:
    return {"metadata": {"name": "c", "managedFields": list(entries)}}


def test_a_created_object_s_update_entry_becomes_the_apply_entry():
    patch = adopt_created(served_with(entry("kube-controller-manager", "Update"), entry("me", "Update")), "me")
    assert patch == [{"op": "test", "path": "/metadata/managedFields/1/manager", "value": "me"},
                     {"op": "test", "path": "/metadata/managedFields/1/operation", "value": "Update"},
                     {"op": "replace", "path": "/metadata/managedFields/1/operation", "value": "Apply"}]


def test_an_update_entry_beside_the_apply_entry_is_dropped():
    patch = adopt_created(served_with(entry("me", "Apply"), entry("me", "Update")), "me")
    assert patch is not None and patch[-1] == {"op": "remove", "path": "/metadata/managedFields/1"}


def test_nothing_to_adopt_without_the_operator_s_update_entry():
    assert adopt_created(served_with(entry("me", "Apply"), entry("someone", "Update")), "me") is None
    assert adopt_created(served_with(entry("me", "Update", subresource="scale")), "me") is None
    assert adopt_created({"metadata": {}}, "me") is None


def test_resource_quantities_compare_as_amounts_as_the_server_rewrites_them():
    served = {"resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "500m", "memory": "1Gi"}}}
    assert contains(served, {"resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 0.5, "memory": "1Gi"}}})
    assert not contains(served, {"resources": {"limits": {"nvidia.com/gpu": 2}}})
    assert not contains({"replicas": "1"}, {"replicas": 1})  # only in a map of quantities
