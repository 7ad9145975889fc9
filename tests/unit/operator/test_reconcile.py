"""The reconcile: its pure parts (the retry delays, the Events an apply deserves), and the one
apply-and-record flow behind the kopf handler and the keeper's repairs, each outcome told apart,
with the real client against an API server's HTTP shape on loopback."""

from __future__ import annotations

import base64
import copy

import kopf
import pytest
from unit.operator.objects import UID, body, deployment_of

from modelplex_operator import builders
from modelplex_operator.handlers.reconcile import backoff, describe_changes, key_of, reconcile, repair
from modelplex_operator.kube import ApplyResult
from modelplex_operator.status import CONFLICT, OK, REJECTED, RETRYING, Outcome

KEY = ("team-a", "recs")


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


# --------------------------------------------------------------------------- apply and record


def internal_secret(labels: dict | None = None, owners: list | None = None) -> dict:
    """The deployment's internal credential as the API answers it."""
    made = builders.internal_secret(deployment_of(body()), builders.owner_reference(body()), "secret")
    metadata = {**made["metadata"], "resourceVersion": "7"}
    if labels is not None:
        metadata["labels"] = labels
    if owners is not None:
        metadata["ownerReferences"] = owners
    return {**made, "metadata": metadata}


#: The deployment's internal credential is made first: the API does not have it, nor the
#: deployment's pods (a new deployment: no namespace credential to upgrade from), then creates it.
CREDENTIAL_MADE = [(404, "no Secret yet"), (404, "no replica Deployment yet"), (201, internal_secret())]


def owned_by_another() -> dict:
    """What the API answers for a ServiceAccount of that name that another controller made."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "recs-replica", "namespace": "team-a", "resourceVersion": "3", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "theirs", "uid": "other", "controller": True}]}}


async def test_a_reconcile_that_applied_everything_records_ok_and_posts_what_it_created(ctx, api, posted):
    outcome = await reconcile(ctx, body(), retry=0)
    assert (outcome.state, outcome.reason) == (OK, "Reconciled") and ctx.outcomes[KEY] == outcome
    secrets = [write for write in api.writes() if "/secrets" in write.path]
    # The namespace's internal credential is made first (POST), then every object is applied.
    assert [write.method for write in secrets] == ["POST"] and secrets[0] == api.writes()[0]
    assert outcome.message == f"applied {len(api.writes()) - len(secrets)} objects"
    assert [(etype, reason) for etype, reason, _ in posted] == [("Normal", "Created")]


async def test_an_object_another_controller_owns_is_a_conflict_retried_later(ctx, api, posted):
    api.answers = [*CREDENTIAL_MADE, (409, "exists"), (200, owned_by_another())]
    with pytest.raises(kopf.TemporaryError) as caught:
        await reconcile(ctx, body(), retry=0)
    assert caught.value.delay == 30
    assert (ctx.outcomes[KEY].state, ctx.outcomes[KEY].reason) == (CONFLICT, "ObjectConflict")
    assert posted == [("Warning", "ObjectConflict", ctx.outcomes[KEY].message)]
    assert "controlled by ReplicaSet theirs" in ctx.outcomes[KEY].message
    # The credential, then the create the API refused (409): nothing written over theirs.
    assert [(write.method, write.path.split("?")[0]) for write in api.writes()] == [
        ("POST", "/api/v1/namespaces/team-a/secrets"), ("POST", "/api/v1/namespaces/team-a/serviceaccounts")]


async def test_a_secret_of_the_credential_s_name_that_modelplex_did_not_make_is_left_alone_and_reported(
        ctx, api, posted):
    api.answers = [(200, internal_secret(labels={"team": "theirs"}, owners=[]))]
    with pytest.raises(kopf.TemporaryError):
        await reconcile(ctx, body(), retry=0)
    assert (ctx.outcomes[KEY].state, ctx.outcomes[KEY].reason) == (CONFLICT, "ObjectConflict")
    assert "Secret recs-internal" in ctx.outcomes[KEY].message
    assert "not made by Modelplex" in ctx.outcomes[KEY].message
    assert api.writes() == [] and posted == [("Warning", "ObjectConflict", ctx.outcomes[KEY].message)]


async def test_a_same_named_object_without_the_operator_s_labels_is_left_alone_and_reported(ctx, api, posted):
    theirs = {"apiVersion": "v1", "kind": "ServiceAccount",
              "metadata": {"name": "recs-replica", "namespace": "team-a", "resourceVersion": "3",
                           "labels": {"team": "theirs"}}}
    api.answers = [*CREDENTIAL_MADE, (409, "exists"), (200, theirs)]
    with pytest.raises(kopf.TemporaryError):
        await reconcile(ctx, body(), retry=0)
    assert (ctx.outcomes[KEY].state, ctx.outcomes[KEY].reason) == (CONFLICT, "ObjectConflict")
    assert ctx.outcomes[KEY].message.startswith("ServiceAccount recs-replica exists and was not made by Modelplex")
    assert posted == [("Warning", "ObjectConflict", ctx.outcomes[KEY].message)]
    assert [write.method for write in api.writes()] == ["POST", "POST"]  # the credential; a refused create
    assert not any(write.method in ("PATCH", "PUT") for write in api.writes())  # theirs untouched


async def test_a_credential_that_an_earlier_deployment_of_the_name_controls_is_a_conflict(ctx, api, posted):
    earlier = {**builders.owner_reference(body()), "uid": "u-earlier"}
    api.answers = [(200, internal_secret(owners=[earlier]))]
    with pytest.raises(kopf.TemporaryError):
        await reconcile(ctx, body(), retry=0)
    assert "Secret recs-internal exists and is controlled by" in ctx.outcomes[KEY].message
    assert api.writes() == [] and ctx.pods.credential(KEY) is None


async def test_each_deployment_of_a_namespace_gets_a_credential_of_its_own_which_the_operator_sends(
        ctx, api, posted):
    await reconcile(ctx, body(), retry=0)
    other = body(name="other")
    other["metadata"]["uid"] = "u-2"
    await reconcile(ctx, other, retry=0)
    made = [request for request in api.writes() if request.path.split("?")[0] == "/api/v1/namespaces/team-a/secrets"]
    assert [request.body["metadata"]["name"] for request in made] == ["recs-internal", "other-internal"]
    assert [[owner["uid"] for owner in request.body["metadata"]["ownerReferences"]] for request in made] == [
        [UID], ["u-2"]]  # each controlled by its deployment alone, and gone with it
    tokens = [base64.b64decode(request.body["data"]["token"]).decode() for request in made]
    assert tokens[0] != tokens[1] and all(len(token) >= 40 for token in tokens)
    assert (ctx.pods.credential(KEY), ctx.pods.credential(("team-a", "other"))) == tuple(tokens)
    assert not any(token in message for token in tokens for _, _, message in posted)


async def test_an_api_that_may_answer_later_is_retried_with_a_growing_delay(ctx, api, posted):
    api.answers = [(503, "etcd leader changed")]
    with pytest.raises(kopf.TemporaryError) as caught:
        await reconcile(ctx, body(), retry=2)
    assert caught.value.delay == 4
    outcome = ctx.outcomes[KEY]
    assert (outcome.state, outcome.reason) == (RETRYING, "ApplyFailed")
    assert outcome.message.endswith("(retry 3 in 4s)") and posted == []  # the status says it; no Event per try


async def test_an_object_the_api_refuses_is_a_permanent_error(ctx, api, posted):
    api.answers = [*CREDENTIAL_MADE, (422, "spec.replicas: Invalid value")]
    with pytest.raises(kopf.PermanentError, match="Invalid value"):
        await reconcile(ctx, body(), retry=0)
    assert (ctx.outcomes[KEY].state, ctx.outcomes[KEY].reason) == (REJECTED, "ApplyRejected")
    assert posted == [("Warning", "ApplyRejected", ctx.outcomes[KEY].message)]


async def test_a_repair_applies_through_the_same_flow_and_says_repaired(ctx, api, posted):
    events = await repair(ctx, body())
    assert [(etype, reason) for etype, reason, _ in events] == [("Normal", "Repaired")] and posted == events
    assert ctx.outcomes[KEY].state == OK and api.writes()


async def test_a_repair_leaves_a_generation_kopf_is_retrying_to_kopf(ctx, api, posted):
    ctx.record(KEY, Outcome(UID, 1, RETRYING, "ApplyFailed", "etcd leader changed"))
    assert await repair(ctx, body()) == []
    assert api.requests == [] and ctx.outcomes[KEY].state == RETRYING


async def test_a_failed_repair_is_recorded_without_an_event(ctx, api, posted):
    api.answers = [*CREDENTIAL_MADE, (409, "exists"), (200, owned_by_another())]
    assert await repair(ctx, body()) == []
    assert ctx.outcomes[KEY].state == CONFLICT and posted == []


async def test_a_repair_from_a_lagging_view_does_not_hide_a_newer_generations_outcome(ctx, api, posted):
    newer = Outcome(UID, 3, REJECTED, "ApplyRejected", "spec.replicas: Invalid value")
    ctx.record(KEY, newer)
    await repair(ctx, body(generation=2))
    assert ctx.outcomes[KEY] == newer


async def test_a_rotated_credential_is_sent_from_the_next_apply(ctx, api, posted):
    await reconcile(ctx, body(), retry=0)
    rotated = internal_secret()
    rotated["data"] = {"token": base64.b64encode(b"rotated-token").decode()}
    api.reset()
    api.answers = [(200, rotated)]
    await repair(ctx, body())
    assert ctx.pods.credential(KEY) == "rotated-token"
    assert not [request for request in api.writes() if "/secrets" in request.path]  # read, never rewritten
