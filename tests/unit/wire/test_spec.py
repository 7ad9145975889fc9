"""The spec: defaults as DESIGN.md says, and errors that name the field and the value."""

import pytest

from modelplex.wire.spec import (DEFAULT_MATCHING_TIMEOUT_S, SpecError, load_manifest, load_manifests, parse_deployment,
                                 parse_spec, to_manifest)

MINIMAL = {"image": "repo/img:1", "modelSource": {"uri": "s3://models/{model_id}/model.pt"}}


def document(spec=None, name="recs"):
    return {
        "apiVersion": "modelplex.io/v1alpha1",
        "kind": "MultiplexedDeployment",
        "metadata": {"name": name},
        "spec": spec if spec is not None else dict(MINIMAL),
    }


def test_defaults_follow_ray_serve():
    spec = parse_spec(MINIMAL)
    assert spec.replicas is None and spec.starting_replicas == 1  # unset: 1, as in Ray Serve
    assert spec.autoscaling is None
    assert spec.multiplexing.matching_timeout_seconds == DEFAULT_MATCHING_TIMEOUT_S == 1.0
    # Unset batching/multiplexing sizes defer to the decorators' arguments.
    assert spec.multiplexing.max_models_per_replica is None
    assert spec.batching.max_batch_size is None
    assert spec.router.port == 8000
    assert spec.metrics.model_label is False
    assert spec.graceful_shutdown_timeout_seconds == 20.0  # Ray Serve's graceful_shutdown_timeout_s


def test_two_routers_by_default_and_a_request_timeout_past_the_load_timeout():
    spec = parse_spec(MINIMAL)
    assert spec.router.replicas == 2
    # Unset, a slow load ends with the cache's own 504 before the router's timeout.
    assert spec.request_timeout_s == spec.multiplexing.load_timeout_seconds + 30
    assert parse_spec({**MINIMAL, "multiplexing": {"loadTimeoutSeconds": 10}}).request_timeout_s == 40
    assert parse_spec({**MINIMAL, "router": {"requestTimeoutSeconds": 2.5}}).request_timeout_s == 2.5


def test_the_grpc_port_is_unset_by_default_and_must_differ_from_the_http_port():
    assert parse_spec(MINIMAL).router.grpc_port is None  # 8001 in pods, a free port locally
    assert parse_spec({**MINIMAL, "router": {"grpcPort": 9001}}).router.grpc_port == 9001
    with pytest.raises(SpecError, match="grpcPort must differ from router.port"):
        parse_spec({**MINIMAL, "router": {"port": 8100, "grpcPort": 8100}})
    with pytest.raises(SpecError, match="grpcPort"):
        parse_spec({**MINIMAL, "router": {"grpcPort": 70000}})


def test_design_example_parses():
    spec = parse_spec({
        "replicas": 3, "image": "registry.example.com/recs:1.4", "handler": "recs.models:Recommender",
        "modelSource": {"uri": "s3://models/{model_id}/model.pt", "secretRef": {"name": "s3-credentials"}},
        "multiplexing": {"maxModelsPerReplica": 3, "matchingTimeoutSeconds": 1.0, "prewarm": ["model-a"]},
        "batching": {"maxBatchSize": 8, "batchWaitTimeoutMs": 10},
        "maxOngoingRequests": 16, "resources": {"limits": {"nvidia.com/gpu": 1}},
        "env": [{"name": "LOG_LEVEL", "value": "info"}], "router": {"replicas": 1, "port": 8000},
    })
    assert spec.batch_wait_timeout_s == pytest.approx(0.01)
    assert spec.model_source.secret_ref.name == "s3-credentials"
    assert spec.multiplexing.prewarm == ("model-a",)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"replicas": -1}, "spec.replicas: Input should be greater than or equal to 0 (got -1)"),
        ({"batching": {"maxBatchSize": 0}}, "spec.batching.maxBatchSize: Input should be greater than or equal to 1 (got 0)"),
        ({"modelSource": {"uri": "ftp://x/{model_id}"}}, "spec.modelSource.uri: scheme must be one of"),
        ({"modelSource": {"uri": "s3://bucket/fixed.pt"}}, "spec.modelSource.uri: must contain {model_id}"),
        ({"handler": "no colon"}, "spec.handler: must look like 'module.path:ClassName'"),
        ({"maxOngoingRequests": 0}, "spec.maxOngoingRequests"),
        ({"router": {"requestTimeoutSeconds": 0}}, "spec.router.requestTimeoutSeconds: Input should be greater than 0"),
        ({"gracefulShutdownTimeoutSeconds": -1}, "spec.gracefulShutdownTimeoutSeconds: Input should be greater"),
        ({"replicaz": 2}, "spec.replicaz: unknown field"),
        ({"multiplexing": {"maxModels": 2}}, "spec.multiplexing.maxModels: unknown field"),
        # autoscaling (Ray Serve's autoscaling_config)
        ({"replicas": 2, "autoscaling": {}}, "spec: replicas and autoscaling are both set (got replicas: 2)"),
        ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
         "spec.autoscaling: minReplicas must be <= maxReplicas (got 3 > 2)"),
        ({"autoscaling": {"maxReplicas": 3, "initialReplicas": 4}},
         "spec.autoscaling: initialReplicas must be within minReplicas and maxReplicas (got 4, outside 1..3)"),
        ({"autoscaling": {"maxReplicas": 0}}, "spec.autoscaling.maxReplicas: Input should be greater than or equal to 1"),
        ({"autoscaling": {"targetOngoingRequests": 0}}, "spec.autoscaling.targetOngoingRequests: Input should be greater"),
        ({"autoscaling": {"upscaleDelaySeconds": -1}}, "spec.autoscaling.upscaleDelaySeconds"),
        ({"autoscaling": {"minReplica": 1}}, "spec.autoscaling.minReplica: unknown field"),
    ],
)
def test_bad_field_is_named_with_its_value(change, expected):
    with pytest.raises(SpecError) as error:
        parse_spec({**MINIMAL, **change})
    assert expected in str(error.value)


def test_missing_image_is_named():
    with pytest.raises(SpecError, match="spec.image: required"):
        parse_spec({"modelSource": MINIMAL["modelSource"]})


def test_builtin_handler_needs_a_model_source():
    with pytest.raises(SpecError, match="modelSource is required"):
        parse_spec({"image": "x"})
    assert parse_spec({"image": "x", "handler": "mod:Cls"}).model_source is None


def test_wrong_kind_and_bad_name_are_named():
    with pytest.raises(SpecError, match="kind: must be MultiplexedDeployment"):
        parse_deployment({**document(), "kind": "Deployment"})
    with pytest.raises(SpecError, match="metadata.name: must be a DNS label"):
        parse_deployment(document(name="Bad_Name"))


def test_multi_document_manifest_and_base_dir(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(
        "apiVersion: modelplex.io/v1alpha1\nkind: MultiplexedDeployment\nmetadata: {name: a}\n"
        "spec: {image: x, handler: 'm:C'}\n---\n"
        "apiVersion: modelplex.io/v1alpha1\nkind: MultiplexedDeployment\nmetadata: {name: b}\n"
        "spec: {image: x, handler: 'm:C'}\n"
    )
    deployments = load_manifests(path)
    assert [d.name for d in deployments] == ["a", "b"]
    assert deployments[0].base_dir == tmp_path
    assert load_manifest(path, "b").name == "b"
    with pytest.raises(SpecError, match="holds 2 deployments"):
        load_manifest(path)


def test_unreadable_and_invalid_yaml_files_get_clear_errors(tmp_path):
    with pytest.raises(SpecError, match="cannot read manifest"):
        load_manifests(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_manifests(bad)


def test_manifest_round_trips_with_its_example_request():
    doc = document()
    doc["metadata"]["annotations"] = {"modelplex.io/example-request": '{"inputs": [1]}'}
    deployment = parse_deployment(doc)
    assert deployment.example_request == '{"inputs": [1]}'
    assert parse_deployment(to_manifest(deployment)) == deployment
