"""The desired objects of an autoscaled deployment: the count the autoscaler keeps, the hot-models file."""

from __future__ import annotations

from unit.operator.objects import UID, body, deployment_of

from modelplex.wire.load import ENV_PRELOAD_FILE
from modelplex_operator import builders
from modelplex_operator.builders import BuildSettings

AUTOSCALING = {"minReplicas": 0, "maxReplicas": 3, "targetOngoingRequests": 2,
               "upscaleDelaySeconds": 2, "downscaleDelaySeconds": 10}


def autoscaled(**autoscaling):
    spec = dict(body(replicas=None, autoscaling={**AUTOSCALING, **autoscaling})["spec"])
    del spec["replicas"]
    doc = body()
    doc["spec"] = spec
    return doc


def replica_deployment(doc, replicas=None):
    objects = builders.desired_objects(deployment_of(doc), builders.owner_reference(doc), BuildSettings(),
                                       replicas=replicas)
    return next(o for o in objects if (o["kind"], o["metadata"]["name"]) == ("Deployment", "recs-replica"))


def pod_spec(obj):
    return obj["spec"]["template"]["spec"]


def test_without_autoscaling_the_spec_says_how_many_and_unset_means_one():
    assert replica_deployment(body(replicas=4))["spec"]["replicas"] == 4
    assert replica_deployment(body(replicas=4), replicas=1)["spec"]["replicas"] == 4  # nobody else's to keep
    unset = body()
    del unset["spec"]["replicas"]
    assert replica_deployment(unset)["spec"]["replicas"] == 1


def test_with_autoscaling_an_apply_keeps_the_autoscalers_count_within_the_bounds():
    doc = autoscaled()
    assert replica_deployment(doc)["spec"]["replicas"] == 0  # created at minReplicas
    assert replica_deployment(autoscaled(initialReplicas=2))["spec"]["replicas"] == 2
    assert replica_deployment(doc, replicas=2)["spec"]["replicas"] == 2  # what the autoscaler wrote stays
    assert replica_deployment(doc, replicas=7)["spec"]["replicas"] == 3  # maxReplicas lowered since
    assert replica_deployment(autoscaled(minReplicas=1), replicas=0)["spec"]["replicas"] == 1


def test_autoscaled_replicas_read_the_hot_models_from_an_optional_config_map_volume():
    pod = pod_spec(replica_deployment(autoscaled()))
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[ENV_PRELOAD_FILE] == "/etc/modelplex-hot-models/hot-models"
    assert {"name": "hot-models", "mountPath": "/etc/modelplex-hot-models", "readOnly": True} in container["volumeMounts"]
    assert {"name": "hot-models", "configMap": {"name": "recs-hot-models", "optional": True}} in pod["volumes"]

    fixed = pod_spec(replica_deployment(body()))
    assert ENV_PRELOAD_FILE not in {e["name"] for e in fixed["containers"][0]["env"]}
    assert "hot-models" not in {v["name"] for v in fixed["volumes"]}


def test_the_hot_models_config_map_lists_one_id_per_line_hottest_first():
    doc = autoscaled()
    cm = builders.hot_models_config_map(deployment_of(doc), builders.owner_reference(doc), ["m7", "m2", "org/m9"])
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "recs-hot-models"
    assert cm["metadata"]["namespace"] == "team-a"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == UID
    assert cm["metadata"]["labels"]["modelplex.io/deployment"] == "recs"
    assert cm["data"] == {"hot-models": "m7\nm2\norg/m9\n"}
    assert builders.hot_models_config_map(deployment_of(doc), builders.owner_reference(doc), [])["data"] == {"hot-models": ""}
    # The reconcile leaves it to the autoscaler (an apply must not wipe the list).
    names = {o["metadata"]["name"] for o in builders.desired_objects(deployment_of(doc), builders.owner_reference(doc))}
    assert "recs-hot-models" not in names


def test_tuning_the_autoscaler_rolls_no_pod_but_turning_it_on_does():
    template = replica_deployment(autoscaled())["spec"]["template"]
    assert replica_deployment(autoscaled(maxReplicas=5, upscaleDelaySeconds=30))["spec"]["template"] == template
    assert replica_deployment(body())["spec"]["template"] != template
