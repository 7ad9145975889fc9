"""A credential per deployment in the operator: what the pods mount (their own Secret, a router
its callers'), the upgrade from the namespace's credential (accepted beside the new one until
every pod has rolled, a condition says so, then refused), and what the operator checks before it
applies (a client named ``internal``, a source URI with a password), never showing a token."""

from __future__ import annotations

import base64

import kopf
import pytest
import yaml
from unit.operator.objects import body, deployment_of

from modelplex_operator import builders
from modelplex_operator.credentials import CREDENTIAL_UPGRADE, rolled
from modelplex_operator.handlers.keeper import StatusKeeper
from modelplex_operator.handlers.observe import Indexes, resource_view
from modelplex_operator.handlers.reconcile import reconcile
from modelplex_operator.status import INVALID, DeploymentView, condition

KEY = ("team-a", "recs")
NAMESPACE_TOKEN = "the-namespace-token-of-an-earlier-version"
T0 = "2026-01-01T00:00:00Z"


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def namespace_secret() -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "data": {"token": b64(NAMESPACE_TOKEN)},
            "metadata": {"name": "modelplex-internal", "namespace": "team-a", "resourceVersion": "3",
                         "labels": {"app.kubernetes.io/managed-by": "modelplex-operator"}}}


def router_pod(doc: dict) -> dict:
    objects = builders.desired_objects(deployment_of(doc), builders.owner_reference(doc))
    (router,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router")]
    return router["spec"]["template"]["spec"]


def test_a_router_mounts_the_credentials_of_the_callers_its_spec_lists_each_as_a_file_of_its_name():
    doc = body(router={"replicas": 1, "callers": ["frontend", "batch-jobs"]})
    pod = router_pod(doc)
    (callers,) = [v for v in pod["volumes"] if v["name"] == "callers"]
    assert callers["projected"]["sources"] == [
        {"secret": {"name": "frontend-internal", "optional": True, "items": [{"key": "token", "path": "frontend"}]}},
        {"secret": {"name": "batch-jobs-internal", "optional": True,
                    "items": [{"key": "token", "path": "batch-jobs"}]}}]
    (container,) = pod["containers"]
    assert {"name": "MODELPLEX_CALLER_TOKENS_DIR", "value": "/var/run/modelplex/callers"} in container["env"]
    assert {"name": "callers", "mountPath": "/var/run/modelplex/callers", "readOnly": True} in container["volumeMounts"]
    # Its own deployment's credential, not the namespace's.
    (own,) = [v for v in pod["volumes"] if v["name"] == "internal-credential"]
    assert own["secret"]["secretName"] == "recs-internal"
    # Without callers, no such volume: nobody else's credential is mounted.
    assert not [v for v in router_pod(body())["volumes"] if v["name"] == "callers"]


def test_the_spec_config_map_holds_a_source_uri_without_its_password_which_reaches_the_replicas_only():
    doc = body(modelSource={"uri": "https://reader:hunter2@models.example.com/{model_id}.pt"})
    objects = {(o["kind"], o["metadata"]["name"]): o
               for o in builders.desired_objects(deployment_of(doc), builders.owner_reference(doc))}
    document = objects["ConfigMap", "recs-spec"]["data"]["spec.yaml"]
    assert "hunter2" not in document and "reader" not in document
    assert yaml.safe_load(document)["spec"]["modelSource"]["uri"] == "https://models.example.com/{model_id}.pt"
    (replica,) = objects["Deployment", "recs-replica"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "MODELPLEX_SOURCE_URI", "value": doc["spec"]["modelSource"]["uri"]} in replica["env"]
    (router,) = objects["Deployment", "recs-router"]["spec"]["template"]["spec"]["containers"]
    assert "hunter2" not in str(router)


async def test_a_deployment_whose_pods_exist_accepts_the_namespace_credential_until_every_pod_has_rolled(
        ctx, api, posted):
    replica_deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "recs-replica"}}
    api.answers = [(404, "no recs-internal yet"), (200, replica_deployment), (200, namespace_secret())]
    await reconcile(ctx, body(), retry=0)
    (made,) = [r for r in api.writes() if r.path.split("?")[0] == "/api/v1/namespaces/team-a/secrets"]
    assert made.body["metadata"]["name"] == "recs-internal"
    assert base64.b64decode(made.body["data"]["namespace-token"]).decode() == NAMESPACE_TOKEN
    own = base64.b64decode(made.body["data"]["token"]).decode()
    assert own != NAMESPACE_TOKEN
    # The operator sends what every pod accepts while the old ones are there: the namespace's.
    assert ctx.pods.credential(KEY) == NAMESPACE_TOKEN

    keeper = StatusKeeper(ctx, lambda view: None, debounce_s=0.01, clock=lambda: T0)
    generations = ctx.credentials._applied[KEY]

    def indexes(updated: int) -> Indexes:
        return Indexes(resources={KEY: [resource_view(body())]}, pods={KEY: []}, deployments={KEY: [
            DeploymentView("recs-replica", "replica", generations["replica"], generations["replica"], 2, 2, 2,
                           updated, 2),
            DeploymentView("recs-router", "router", generations["router"], generations["router"], 1, 1, 1, 1, 1)]})

    api.reset()
    ctx.indexes = indexes(updated=1)  # one replica pod still runs the old template
    written = await keeper.refresh(KEY)
    upgrade = condition(written, CREDENTIAL_UPGRADE)
    assert (upgrade["status"], upgrade["reason"]) == ("True", "AcceptingNamespaceCredential")
    assert not [r for r in api.writes() if "/secrets" in r.path]

    ctx.indexes = indexes(updated=2)  # every pod rolled: the namespace's token leaves the Secret
    written = await keeper.refresh(KEY)
    (patch,) = [r for r in api.writes() if "/secrets" in r.path]
    assert patch.method == "PATCH" and patch.path.split("?")[0] == "/api/v1/namespaces/team-a/secrets/recs-internal"
    assert patch.body["data"] == {"namespace-token": None}
    upgrade = condition(written, CREDENTIAL_UPGRADE)
    assert (upgrade["status"], upgrade["reason"]) == ("False", "Completed")
    assert ("Normal", "CredentialUpgraded") in [(etype, reason) for etype, reason, _ in posted]
    assert ctx.pods.credential(KEY) == own  # from now on, the deployment's own
    assert not any(token in message for token in (own, NAMESPACE_TOKEN) for _, _, message in posted)
    assert NAMESPACE_TOKEN not in str(written) and own not in str(written)


async def test_a_new_deployment_never_holds_the_namespace_credential_and_has_no_upgrade_condition(ctx, api, posted):
    api.answers = [(404, "no recs-internal"), (404, "no pods yet")]
    await reconcile(ctx, body(), retry=0)
    (made,) = [r for r in api.writes() if r.path.split("?")[0] == "/api/v1/namespaces/team-a/secrets"]
    assert set(made.body["data"]) == {"token"} and "annotations" not in made.body["metadata"]
    assert not [r for r in api.requests if "modelplex-internal" in r.path]  # not even read
    assert ctx.credentials.state(KEY) == ""


def test_an_upgrade_waits_for_the_templates_the_operator_applied_not_an_older_rolled_out_one():
    views = [DeploymentView("recs-replica", "replica", 4, 4, 2, 2, 2, 2, 2),
             DeploymentView("recs-router", "router", 3, 3, 1, 1, 1, 1, 1)]
    assert rolled(views, {"replica": 4, "router": 3})
    assert not rolled(views, {"replica": 5, "router": 3})  # the index has not seen the apply yet
    assert not rolled(views[:1], {"replica": 4, "router": 3})


async def test_a_client_named_internal_in_the_auth_secret_makes_the_spec_invalid_naming_the_key_not_the_token(
        ctx, api, posted):
    clients = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "recs-clients"},
               "data": {"alice": b64("alice-token-1"), "internal": b64("sneaky-token-2")}}
    api.answers = [(200, clients)]
    doc = body(router={"replicas": 1, "auth": {"secretRef": {"name": "recs-clients"}}})
    with pytest.raises(kopf.PermanentError):
        await reconcile(ctx, doc, retry=0)
    outcome = ctx.outcomes[KEY]
    assert (outcome.state, outcome.reason) == (INVALID, "InvalidSpec")
    assert "client named 'internal'" in outcome.message and "recs-clients" in outcome.message
    assert posted == [("Warning", "InvalidSpec", outcome.message)]
    assert "sneaky-token-2" not in outcome.message and "alice-token-1" not in outcome.message
    assert api.writes() == []


async def test_a_new_deployment_with_a_password_in_its_source_uri_is_refused(ctx, api, posted):
    doc = body(modelSource={"uri": "https://reader:hunter2@models.example.com/{model_id}.pt"})
    with pytest.raises(kopf.PermanentError):
        await reconcile(ctx, doc, retry=0)
    outcome = ctx.outcomes[KEY]
    assert outcome.state == INVALID and "secretRef" in outcome.message and "hunter2" not in outcome.message
    assert "hunter2" not in str(posted) and api.writes() == []


async def test_an_existing_deployment_with_a_password_in_its_source_uri_gets_a_warning_and_keeps_serving(
        ctx, api, posted):
    replica_deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "recs-replica"}}
    recs_internal = builders.internal_secret(deployment_of(body()), builders.owner_reference(body()), "own-token")
    api.answers = [(200, replica_deployment), (200, recs_internal)]
    doc = body(modelSource={"uri": "https://reader:hunter2@models.example.com/{model_id}.pt"})
    outcome = await reconcile(ctx, doc, retry=0)
    assert outcome.reason == "Reconciled"
    warning = ctx.warnings[KEY]["SourceCredentials"]
    assert (warning["status"], warning["reason"]) == ("True", "UserinfoInURI")
    assert ("Warning", "UserinfoInURI", warning["message"]) in posted
    assert "hunter2" not in str(posted) and "hunter2" not in warning["message"]
    # The keeper puts it on the status beside the serving conditions.
    ctx.indexes = Indexes(resources={KEY: [resource_view(doc)]}, pods={KEY: []}, deployments={KEY: []})
    written = await StatusKeeper(ctx, lambda view: None, clock=lambda: T0).refresh(KEY)
    assert condition(written, "SourceCredentials")["reason"] == "UserinfoInURI"
