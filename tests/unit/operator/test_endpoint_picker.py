"""The operator's side of the Endpoint Picker: the router's picker port (container, Service,
command line), the InferencePool it builds, who the NetworkPolicies let reach the picker and the
replicas, and the reconcile that applies the pool apart from the rest (a missing CRD is a
condition and one Event, never a failed reconcile) and removes it with the picker off."""

from __future__ import annotations

from unit.operator.objects import body, deployment_of

from modelplex.wire.names import LABEL_DEPLOYMENT, LABEL_ROLE, REPLICA_PORT
from modelplex_operator import builders
from modelplex_operator.builders import BuildSettings
from modelplex_operator.handlers.reconcile import reconcile, repair
from modelplex_operator.pools import CRD_MISSING, ENDPOINT_PICKER, POOL_APPLIED
from modelplex_operator.status import OK

KEY = ("team-a", "recs")
GATEWAY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}},
           "podSelector": {"matchLabels": {"app": "envoy"}}}
POOLS = "/apis/inference.networking.k8s.io/v1/namespaces/team-a/inferencepools"


def picker_body(**picker) -> dict:
    return body(router={"replicas": 1, "port": 8000, "endpointPicker": {"enabled": True, **picker}})


def built(doc: dict, settings: BuildSettings = BuildSettings()) -> dict[tuple[str, str], dict]:
    objects = builders.desired_objects(deployment_of(doc), builders.owner_reference(doc), settings)
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def router_container(objects: dict) -> dict:
    return objects["Deployment", "recs-router"]["spec"]["template"]["spec"]["containers"][0]


def pool_of(doc: dict) -> dict | None:
    return builders.inference_pool(deployment_of(doc), builders.owner_reference(doc))


# --------------------------------------------------------------------------- builders


def test_with_the_picker_on_the_router_serves_it_on_a_named_port_that_its_service_exposes():
    objects = built(picker_body())
    c = router_container(objects)
    assert c["args"][-2:] == ["--picker-port", "9002"]
    assert {"name": "picker", "containerPort": 9002, "protocol": "TCP"} in c["ports"]
    assert {"name": "picker", "port": 9002, "targetPort": "picker", "protocol": "TCP"} in \
        objects["Service", "recs"]["spec"]["ports"]
    port = built(picker_body(port=9100))
    assert router_container(port)["args"][-2:] == ["--picker-port", "9100"]
    assert {"name": "picker", "port": 9100, "targetPort": "picker", "protocol": "TCP"} in \
        port["Service", "recs"]["spec"]["ports"]


def test_with_the_picker_off_nothing_of_it_is_built():
    objects = built(body())
    assert "--picker-port" not in router_container(objects)["args"]
    assert "picker" not in {p["name"] for p in router_container(objects)["ports"]}
    assert "picker" not in {p["name"] for p in objects["Service", "recs"]["spec"]["ports"]}
    assert pool_of(body()) is None
    assert pool_of(body(router={"endpointPicker": {"enabled": False, "port": 9100}})) is None


def test_the_inference_pool_selects_the_replicas_on_their_api_port_and_names_the_router_service_s_picker_port():
    pool = pool_of(picker_body(port=9100, failureMode="FailOpen"))
    assert (pool["apiVersion"], pool["kind"]) == ("inference.networking.k8s.io/v1", "InferencePool")
    assert pool["metadata"]["name"] == "recs" and pool["metadata"]["namespace"] == "team-a"
    assert pool["metadata"]["ownerReferences"] == [builders.owner_reference(body())]
    assert pool["metadata"]["labels"][LABEL_DEPLOYMENT] == "recs"
    assert pool["spec"] == {
        "selector": {"matchLabels": {LABEL_DEPLOYMENT: "recs", LABEL_ROLE: "replica"}},
        "targetPorts": [{"number": REPLICA_PORT}],
        "endpointPickerRef": {"group": "", "kind": "Service", "name": "recs", "port": {"number": 9100},
                              "failureMode": "FailOpen"},
    }
    # The selector is the replica pods' own labels.
    replica = built(picker_body())["Deployment", "recs-replica"]
    labels = replica["spec"]["template"]["metadata"]["labels"]
    assert pool_of(picker_body())["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pool_of(picker_body())["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"


def policies(doc: dict, settings: BuildSettings = BuildSettings()) -> dict[str, list[dict]]:
    objects = built(doc, settings)
    return {role: objects["NetworkPolicy", f"recs-{role}"]["spec"]["ingress"] for role in ("replica", "router")}


def test_gateway_from_reaches_the_replicas_api_port_and_the_picker_port_and_nothing_else():
    rules = policies(picker_body(gatewayFrom=[GATEWAY]))
    assert rules["replica"][-1] == {"from": [GATEWAY], "ports": [{"port": REPLICA_PORT, "protocol": "TCP"}]}
    # The routers' other ports stay open to all (mode "replicas"); the picker's only to the Gateway.
    assert rules["router"] == [
        {"ports": [{"port": 8000, "protocol": "TCP"}, {"port": 8001, "protocol": "TCP"},
                   {"port": 9091, "protocol": "TCP"}]},
        {"from": [GATEWAY], "ports": [{"port": 9002, "protocol": "TCP"}]}]
    assert all(9002 not in {p["port"] for p in rule.get("ports", [])}
               for rule in rules["router"] if rule.get("from") != [GATEWAY])


def test_with_no_gateway_named_nobody_reaches_the_picker_and_the_replicas_gain_no_peer():
    on, off = policies(picker_body()), policies(body())
    assert on["replica"] == off["replica"]
    assert on["router"] == [{"ports": [{"port": 8000, "protocol": "TCP"}, {"port": 8001, "protocol": "TCP"},
                                       {"port": 9091, "protocol": "TCP"}]}]
    assert off["router"] == [{}]


def test_strict_keeps_the_namespace_off_the_picker_port_and_none_stays_open():
    strict = picker_body(gatewayFrom=[GATEWAY])
    strict["spec"]["networkPolicy"] = {"mode": "strict"}
    assert policies(strict)["router"] == [
        {"from": [{"podSelector": {}}], "ports": [{"port": 8000, "protocol": "TCP"}, {"port": 8001, "protocol": "TCP"},
                                                  {"port": 9091, "protocol": "TCP"}]},
        {"from": [GATEWAY], "ports": [{"port": 9002, "protocol": "TCP"}]}]
    none = picker_body(gatewayFrom=[GATEWAY])
    none["spec"]["networkPolicy"] = {"mode": "none"}
    assert policies(none) == {"replica": [{}], "router": [{}]}


# --------------------------------------------------------------------------- the reconcile


def pool_writes(api) -> list[tuple[str, str]]:
    return [(r.method, r.path.split("?")[0]) for r in api.requests if "inferencepools" in r.path]


async def test_a_picker_deployment_gets_its_pool_created_with_the_rest_and_a_true_condition(ctx, api, posted):
    outcome = await reconcile(ctx, picker_body(), retry=0)
    assert outcome.state == OK
    assert pool_writes(api) == [("POST", POOLS)]
    (created,) = [message for _, reason, message in posted if reason == "Created"]
    assert created.endswith(", InferencePool recs")
    condition = ctx.warnings[KEY][ENDPOINT_PICKER]
    assert (condition["status"], condition["reason"]) == ("True", POOL_APPLIED)
    assert "Service recs port 9002" in condition["message"]


async def test_without_the_inference_pool_crd_the_reconcile_succeeds_and_says_so_once(ctx, api, posted):
    api.unknown = {"inferencepools"}
    outcome = await reconcile(ctx, picker_body(), retry=0)
    assert outcome.state == OK  # everything else applied
    condition = ctx.warnings[KEY][ENDPOINT_PICKER]
    assert (condition["type"], condition["status"], condition["reason"]) == (ENDPOINT_PICKER, "False", CRD_MISSING)
    warnings = [(reason, message) for etype, reason, message in posted if etype == "Warning"]
    assert warnings == [(f"{ENDPOINT_PICKER}{CRD_MISSING}", condition["message"])]
    assert "InferencePool CRD" in condition["message"]
    # The next reconcile and the keeper's repair try again, and say nothing new.
    posted.clear()
    await reconcile(ctx, picker_body(), retry=0)
    await repair(ctx, picker_body(generation=1))
    assert not [p for p in posted if p[0] == "Warning"]
    assert ctx.warnings[KEY][ENDPOINT_PICKER]["reason"] == CRD_MISSING
    # The CRD installed: the next repair applies the pool, and the condition turns True.
    api.unknown = set()
    await repair(ctx, picker_body())
    assert ctx.warnings[KEY][ENDPOINT_PICKER]["reason"] == POOL_APPLIED
    assert pool_writes(api)[-1] == ("POST", POOLS)


async def test_with_the_picker_turned_off_the_operator_deletes_its_own_pool_and_then_asks_no_more(ctx, api, posted):
    made = pool_of(picker_body())
    api.objects[f"{POOLS}/recs"] = {**made, "metadata": {**made["metadata"], "uid": "pool-uid", "resourceVersion": "4"}}
    assert (await reconcile(ctx, body(), retry=0)).state == OK
    assert pool_writes(api) == [("GET", f"{POOLS}/recs"), ("DELETE", f"{POOLS}/recs")]
    (delete,) = [r for r in api.requests if r.method == "DELETE"]
    assert delete.body["preconditions"] == {"uid": "pool-uid"}
    assert ENDPOINT_PICKER not in ctx.warnings[KEY]
    api.requests.clear()
    await repair(ctx, body(generation=2))
    assert pool_writes(api) == []  # known absent: not asked again


async def test_with_the_picker_off_a_pool_of_that_name_that_is_not_ours_is_left_alone(ctx, api, posted):
    api.objects[f"{POOLS}/recs"] = {**pool_of(picker_body()), "metadata": {
        "name": "recs", "namespace": "team-a", "uid": "theirs", "ownerReferences": []}}
    assert (await reconcile(ctx, body(), retry=0)).state == OK
    assert pool_writes(api) == [("GET", f"{POOLS}/recs")]


def test_the_failure_mode_and_the_gateway_peers_roll_no_pod_but_turning_the_picker_on_does():
    """What only the InferencePool and the NetworkPolicies read changes no pod template."""
    base = builders.spec_hash(deployment_of(picker_body()))
    assert builders.spec_hash(deployment_of(picker_body(failureMode="FailOpen", gatewayFrom=[GATEWAY]))) == base
    assert builders.spec_hash(deployment_of(body(router={"replicas": 1, "port": 8000}))) != base
