"""The desired objects: names, labels, ownership, pods that run `modelplex replica|router`."""

from __future__ import annotations

import yaml
from unit.operator.objects import UID, body, deployment_of

from modelplex.wire.names import (ANNOTATION_LOADED_MODELS, ENV_POD_IP, ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_SPEC,
                                  LABEL_DEPLOYMENT, LABEL_ROLE, REPLICA_CONTROL_PORT, REPLICA_PORT)
from modelplex.wire.spec import load_manifest, to_manifest
from modelplex_operator import builders
from modelplex_operator.builders import BuildSettings

SETTINGS = BuildSettings(router_image="registry.example.com/modelplex/router:0.1.0")


def build(doc=None, settings=SETTINGS):
    doc = doc or body()
    return builders.desired_objects(deployment_of(doc), builders.owner_reference(doc), settings)


def by_kind_name(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def container(obj):
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return only


def env_of(c):
    return {e["name"]: e for e in c["env"]}


def test_the_objects_of_design_md_in_apply_order():
    objects = build()
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", "recs-replica"),
        ("ServiceAccount", "recs-router"),
        ("Role", "recs-replica"),
        ("Role", "recs-router"),
        ("RoleBinding", "recs-replica"),
        ("RoleBinding", "recs-router"),
        ("ConfigMap", "recs-spec"),
        ("Service", "recs"),
        ("NetworkPolicy", "recs-replica"),
        ("NetworkPolicy", "recs-router"),
        ("Deployment", "recs-replica"),
        ("Deployment", "recs-router"),
        ("PodDisruptionBudget", "recs-replica"),
        ("PodDisruptionBudget", "recs-router"),
    ]


def test_every_object_is_owned_labelled_and_namespaced():
    for obj in build():
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [{
            "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "name": "recs",
            "uid": UID, "controller": True, "blockOwnerDeletion": True,
        }]
        labels = meta["labels"]
        assert labels[LABEL_DEPLOYMENT] == "recs"
        assert labels["app.kubernetes.io/name"] == "modelplex"
        assert labels["app.kubernetes.io/instance"] == "recs"
        assert labels["app.kubernetes.io/managed-by"] == "modelplex-operator"
        assert labels["app.kubernetes.io/part-of"] == "modelplex"
        assert labels["app.kubernetes.io/component"]


def test_rbac_is_least_privilege():
    objects = by_kind_name(build())
    assert objects["Role", "recs-replica"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
    ]
    assert objects["Role", "recs-router"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    for role in ("replica", "router"):
        binding = objects["RoleBinding", f"recs-{role}"]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"recs-{role}"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"recs-{role}", "namespace": "team-a"}]
        pod = objects["Deployment", f"recs-{role}"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == f"recs-{role}"


def test_the_config_map_holds_the_manifest_the_pods_read(tmp_path):
    doc = body()
    cm = by_kind_name(build(doc))["ConfigMap", "recs-spec"]
    path = tmp_path / "spec.yaml"
    path.write_text(cm["data"]["spec.yaml"])
    read_back = load_manifest(path)
    assert read_back.name == "recs" and read_back.namespace == "team-a"
    # Everything but spec.env, whose values the routers (which mount it too) must not hold: the
    # replicas get them as their container's environment.
    assert read_back.spec == deployment_of(doc).spec.model_copy(update={"env": ()})
    expected = to_manifest(deployment_of(doc))
    expected["spec"].pop("env")
    assert yaml.safe_load(cm["data"]["spec.yaml"]) == expected
    assert "info" not in cm["data"]["spec.yaml"] and "LOG_LEVEL" not in cm["data"]["spec.yaml"]


def test_replica_deployment_runs_modelplex_replica():
    dep = by_kind_name(build())["Deployment", "recs-replica"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["selector"] == {"matchLabels": {LABEL_DEPLOYMENT: "recs", LABEL_ROLE: "replica"}}
    template = dep["spec"]["template"]
    assert template["metadata"]["labels"][LABEL_ROLE] == "replica"
    assert template["metadata"]["labels"][LABEL_DEPLOYMENT] == "recs"
    c = container(dep)
    assert c["command"] == ["modelplex", "replica", "--control-port", str(REPLICA_CONTROL_PORT)]
    assert c["image"] == "registry.example.com/recs:1.4"
    assert c["ports"] == [{"name": "http", "containerPort": REPLICA_PORT, "protocol": "TCP"},
                          {"name": "control", "containerPort": REPLICA_CONTROL_PORT, "protocol": "TCP"}]
    env = env_of(c)
    assert env[ENV_SPEC] == {"name": ENV_SPEC, "value": "/etc/modelplex/spec.yaml"}
    assert env[ENV_POD_NAME]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env[ENV_POD_NAMESPACE]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env[ENV_POD_IP]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # spec.env comes after the operator's own entries
    assert c["env"][-1] == {"name": "LOG_LEVEL", "value": "info"}
    assert c["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    # Probes go to the control port, answered by a loop that never runs user code.
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "control"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "control"}
    # a replica whose models saturate the node stays in its Service: slow answers are tolerated
    assert c["readinessProbe"]["timeoutSeconds"] >= 5 and c["readinessProbe"]["failureThreshold"] >= 3
    assert c["livenessProbe"]["timeoutSeconds"] >= 30
    assert c["volumeMounts"] == [{"name": "spec", "mountPath": "/etc/modelplex", "readOnly": True},
                                 {"name": "tmp", "mountPath": "/tmp"},
                                 {"name": "internal-credential", "mountPath": "/var/run/modelplex/internal",
                                  "readOnly": True}]
    assert template["spec"]["volumes"] == [
        {"name": "spec", "configMap": {"name": "recs-spec"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "internal-credential", "secret": {"secretName": "recs-internal", "defaultMode": 0o440}}]
    assert env["MODELPLEX_INTERNAL_TOKEN_FILE"]["value"] == "/var/run/modelplex/internal/token"
    # The namespace's credential of an upgrade, while the deployment's Secret holds it.
    assert env["MODELPLEX_LEGACY_TOKEN_FILE"]["value"] == "/var/run/modelplex/internal/namespace-token"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert template["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert template["spec"]["securityContext"]["fsGroup"] == 10001  # the mounted credential (0440) is readable
    # a preStop wait, then the drain (gracefulShutdownTimeoutSeconds, 20 s by default)
    assert template["spec"]["terminationGracePeriodSeconds"] > 5 + 20


def test_env_value_from_passes_through_and_no_secret_means_no_env_from():
    doc = body(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
               modelSource={"uri": "file:///models/{model_id}.pt"}, resources={})
    c = container(by_kind_name(build(doc))["Deployment", "recs-replica"])
    assert c["env"][-1] == {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    assert "envFrom" not in c
    assert "resources" not in c


def test_router_deployment_and_service():
    doc = body(router={"replicas": 2, "port": 8100})
    objects = by_kind_name(build(doc))
    dep = objects["Deployment", "recs-router"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["selector"] == {"matchLabels": {LABEL_DEPLOYMENT: "recs", LABEL_ROLE: "router"}}
    c = container(dep)
    assert c["command"] == ["modelplex", "router"]
    assert c["args"] == ["--port", "8100", "--grpc-port", "8001", "--control-port", "9091"]
    assert c["image"] == "registry.example.com/modelplex/router:0.1.0"
    assert c["ports"] == [{"name": "http", "containerPort": 8100, "protocol": "TCP"},
                          {"name": "grpc", "containerPort": 8001, "protocol": "TCP"},
                          {"name": "control", "containerPort": 9091, "protocol": "TCP"}]
    # The kubelet asks the control port, which a public port full of idle clients cannot block.
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "control"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "control"}
    assert "LOG_LEVEL" not in env_of(c)  # spec.env is the replica's
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    svc = objects["Service", "recs"]
    assert svc["spec"]["selector"] == {LABEL_DEPLOYMENT: "recs", LABEL_ROLE: "router"}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8100, "targetPort": "http", "protocol": "TCP"},
                                    {"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP"},
                                    {"name": "control", "port": 9091, "targetPort": "control", "protocol": "TCP"}]


def test_a_router_grpc_port_from_the_spec_reaches_the_container_and_service():
    objects = by_kind_name(build(body(router={"grpcPort": 9001})))
    c = container(objects["Deployment", "recs-router"])
    assert c["args"][2:4] == ["--grpc-port", "9001"]
    assert {"name": "grpc", "containerPort": 9001, "protocol": "TCP"} in c["ports"]
    assert {"name": "grpc", "port": 9001, "targetPort": "grpc", "protocol": "TCP"} in objects["Service", "recs"]["spec"]["ports"]


def test_a_router_control_port_from_the_spec_reaches_the_container_its_probes_the_service_and_the_policy():
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    objects = by_kind_name(build(body(router={"controlPort": 9191}, networkPolicy={"mode": "strict"}),
                                 BuildSettings(metrics_from=(scraper,))))
    c = container(objects["Deployment", "recs-router"])
    assert c["args"][-2:] == ["--control-port", "9191"]
    assert {"name": "control", "containerPort": 9191, "protocol": "TCP"} in c["ports"]
    assert c["readinessProbe"]["httpGet"]["port"] == c["livenessProbe"]["httpGet"]["port"] == "control"
    assert {"name": "control", "port": 9191, "targetPort": "control", "protocol": "TCP"} in \
        objects["Service", "recs"]["spec"]["ports"]
    # strict: the namespace's pods on every port, the named scrapers on the control port only.
    assert objects["NetworkPolicy", "recs-router"]["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}]},
        {"from": [scraper], "ports": [{"port": 9191, "protocol": "TCP"}]}]


def test_the_router_discovers_the_replica_port_by_its_name():
    # modelplex_router.discovery.kubernetes.replica_port reads the container port named "http".
    from modelplex_router.discovery.kubernetes import replica_port

    dep = by_kind_name(build())["Deployment", "recs-replica"]
    assert replica_port({"spec": dep["spec"]["template"]["spec"]}) == REPLICA_PORT


def test_scaling_does_not_roll_the_pods_but_a_spec_change_does():
    def hash_of(doc):
        return by_kind_name(build(doc))["Deployment", "recs-replica"]["spec"]["template"]["metadata"]["annotations"][
            builders.ANNOTATION_SPEC_HASH]

    base = hash_of(body())
    assert hash_of(body()) == base  # stable
    assert hash_of(body(replicas=5)) == base
    assert hash_of(body(router={"replicas": 3, "port": 8000})) == base
    assert hash_of(body(batching={"maxBatchSize": 4, "batchWaitTimeoutMs": 10})) != base
    assert hash_of(body(image="registry.example.com/recs:1.5")) != base
    assert hash_of(body(env=[{"name": "LOG_LEVEL", "value": "debug"}])) != base
    router = by_kind_name(build())["Deployment", "recs-router"]
    assert router["spec"]["template"]["metadata"]["annotations"][builders.ANNOTATION_SPEC_HASH] == base


def test_pods_keep_serving_while_they_roll():
    for role in ("replica", "router"):
        dep = by_kind_name(build())["Deployment", f"recs-{role}"]
        assert dep["spec"]["strategy"] == {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def test_image_pull_policy_only_when_set():
    plain = container(by_kind_name(build())["Deployment", "recs-replica"])
    assert "imagePullPolicy" not in plain
    pulled = container(by_kind_name(build(settings=BuildSettings(image_pull_policy="Always")))["Deployment",
                                                                                               "recs-router"])
    assert pulled["imagePullPolicy"] == "Always"


def test_the_scale_selector_matches_the_replica_pods():
    dep = by_kind_name(build())["Deployment", "recs-replica"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for term in builders.selector_string("recs").split(","):
        k, v = term.split("=")
        assert labels[k] == v


def test_nothing_is_built_from_the_annotation_contract():
    # The operator reads the loaded-models annotation; it never writes it into templates.
    for obj in build():
        text = yaml.safe_dump(obj)
        assert ANNOTATION_LOADED_MODELS not in text


def test_the_warm_tier_gets_an_empty_dir_sized_from_host_cache_bytes():
    multiplexing = {"maxModelsPerReplica": 3, "hostCacheBytes": "2Gi", "maxConcurrentLoads": 3}
    dep = by_kind_name(build(body(multiplexing=multiplexing)))["Deployment", "recs-replica"]
    c = container(dep)
    assert env_of(c)["MODELPLEX_WARM_DIR"] == {"name": "MODELPLEX_WARM_DIR", "value": "/var/cache/modelplex/warm"}
    assert {"name": "warm-models", "mountPath": "/var/cache/modelplex/warm"} in c["volumeMounts"]
    # At most hostCacheBytes kept, plus one copy being written per load in flight.
    assert {"name": "warm-models", "emptyDir": {"sizeLimit": str(3 * (2 << 30))}} in dep["spec"]["template"]["spec"]["volumes"]
    # Off (the default): no volume, no variable.
    plain = by_kind_name(build())["Deployment", "recs-replica"]
    assert "MODELPLEX_WARM_DIR" not in env_of(container(plain))
    assert all(v["name"] != "warm-models" for v in plain["spec"]["template"]["spec"]["volumes"])


def policies_of(doc: dict, settings: BuildSettings = SETTINGS) -> dict[str, dict]:
    return {o["metadata"]["name"]: o["spec"] for o in build(doc, settings) if o["kind"] == "NetworkPolicy"}


def test_by_default_a_replica_accepts_its_api_port_only_from_its_routers_and_the_operator_and_its_control_port_from_named_scrapers():
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    policies = policies_of(body(), BuildSettings(operator_namespace="modelplex-system", metrics_from=(scraper,)))
    replica = policies["recs-replica"]
    assert replica["podSelector"] == {"matchLabels": {LABEL_DEPLOYMENT: "recs", LABEL_ROLE: "replica"}}
    assert replica["policyTypes"] == ["Ingress"]  # egress open: the apiserver and model stores
    api, control = replica["ingress"]
    assert api["ports"] == [{"port": REPLICA_PORT, "protocol": "TCP"}]
    assert api["from"] == [
        {"podSelector": {"matchLabels": {LABEL_DEPLOYMENT: "recs", LABEL_ROLE: "router"}}},
        {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator",
                                         "app.kubernetes.io/part-of": "modelplex"}},
         "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "modelplex-system"}}}]
    assert control == {"from": [scraper], "ports": [{"port": REPLICA_CONTROL_PORT, "protocol": "TCP"}]}
    # No scrapers named: the API rule alone (the kubelet's probes come from the node, which policies let in).
    (only,) = policies_of(body(), BuildSettings(operator_namespace="modelplex-system"))["recs-replica"]["ingress"]
    assert only["ports"] == [{"port": REPLICA_PORT, "protocol": "TCP"}]
    assert policies["recs-router"]["ingress"] == [{}]  # the router is the Service: open


def test_strict_limits_the_routers_to_their_namespace_and_none_opens_the_replicas():
    assert policies_of(body(networkPolicy={"mode": "strict"}))["recs-router"]["ingress"] == [
        {"from": [{"podSelector": {}}]}]
    # An allow-all policy takes the restrictive one's place: the operator deletes nothing.
    assert policies_of(body(networkPolicy={"mode": "none"}))["recs-replica"]["ingress"] == [{}]


def test_with_the_operator_namespace_unknown_a_replica_admits_the_operator_from_its_own_namespace_never_all():
    (api,) = policies_of(body(), BuildSettings(operator_namespace=""))["recs-replica"]["ingress"]
    operator = api["from"][1]
    assert operator == {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator",
                                                        "app.kubernetes.io/part-of": "modelplex"}}}
    assert all(peer.get("namespaceSelector") != {} for peer in api["from"])
