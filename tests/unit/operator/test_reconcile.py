"""The reconcile's pure parts: the retry delays and the Events an apply deserves."""

from __future__ import annotations

import copy

from modelplex_operator import builders
from modelplex_operator.handlers.reconcile import backoff, describe_changes, key_of
from modelplex_operator.kube import ApplyResult
from unit.operator.objects import body, deployment_of


def objects(doc=None):
    doc = doc or body()
    return builders.desired_objects(deployment_of(doc), builders.owner_reference(doc))


def test_backoff_grows_and_is_capped():
    assert [backoff(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff(-1) == 1


def test_key():
    assert key_of(body()) == ("team-a", "recs")


def test_created_objects_make_one_event():
    results = [(obj, ApplyResult("created", None, obj)) for obj in objects()]
    events = describe_changes(results)
    assert len(events) == 1
    etype, reason, message = events[0]
    assert (etype, reason) == ("Normal", "Created")
    assert message.startswith("created ServiceAccount recs-replica, ")
    assert message.endswith("Deployment recs-replica, Deployment recs-router, "
                            "PodDisruptionBudget recs-replica, PodDisruptionBudget recs-router")


def test_nothing_changed_means_no_event():
    assert describe_changes([(obj, ApplyResult("unchanged", obj, obj)) for obj in objects()]) == []


def test_scaling_and_rolling_are_told_apart():
    old = {(o["kind"], o["metadata"]["name"]): o for o in objects()}
    new_objects = objects(body(replicas=3, batching={"maxBatchSize": 2}))
    results = []
    for obj in new_objects:
        before = copy.deepcopy(old[obj["kind"], obj["metadata"]["name"]])
        action = "unchanged" if before == obj else "updated"
        results.append((obj, ApplyResult(action, before, obj)))
    events = {reason: message for _, reason, message in describe_changes(results)}
    assert events["Scaled"] == "scaled Deployment recs-replica from 2 to 3"
    assert "rolling the pods of Deployment recs-replica" in events["RollingUpdate"]
    assert "Deployment recs-router" in events["RollingUpdate"]
    assert events["Updated"] == "updated ConfigMap recs-spec"


def test_scale_only_rolls_nothing():
    old = {(o["kind"], o["metadata"]["name"]): o for o in objects()}
    results = []
    for obj in objects(body(replicas=4)):
        before = old[obj["kind"], obj["metadata"]["name"]]
        results.append((obj, ApplyResult("unchanged" if before == obj else "updated", before, obj)))
    reasons = [reason for _, reason, _ in describe_changes(results)]
    assert "Scaled" in reasons and "RollingUpdate" not in reasons
