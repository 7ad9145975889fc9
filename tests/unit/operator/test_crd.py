"""The CRD: one source file, the chart's copy equal to it, and a schema that matches the spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modelplex.wire import names
from modelplex.wire.spec import (DEFAULT_MATCHING_TIMEOUT_S, DEFAULT_MAX_ONGOING_REQUESTS, Autoscaling, Batching,
                                 DeploymentSpec, LoadQuota, Metrics, ModelEntry, ModelSource, Multiplexing, RouterSpec,
                                 parse_spec)

ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = ROOT / "crds" / "multiplexeddeployments.modelplex.io.yaml"
CHART_CRD = ROOT / "charts" / "modelplex" / "crds" / CRD_FILE.name


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load(CRD_FILE.read_text())


@pytest.fixture(scope="module")
def version(crd) -> dict:
    (only,) = crd["spec"]["versions"]
    return only


@pytest.fixture(scope="module")
def spec_schema(version) -> dict:
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_the_chart_ships_the_same_file():
    assert CHART_CRD.read_bytes() == CRD_FILE.read_bytes(), (
        f"{CHART_CRD} differs from {CRD_FILE}: copy the top-level file over the chart's"
    )


def test_names_match_modelplex_names(crd, version):
    assert crd["metadata"]["name"] == f"{names.PLURAL}.{names.API_GROUP}"
    assert crd["spec"]["group"] == names.API_GROUP
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == names.KIND
    assert crd["spec"]["names"]["plural"] == names.PLURAL
    assert names.SHORT_NAME in crd["spec"]["names"]["shortNames"]
    assert version["name"] == names.API_VERSION and version["served"] and version["storage"]


def test_status_and_scale_subresources(version):
    sub = version["subresources"]
    assert sub["status"] == {}
    assert sub["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_printer_columns(version):
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    shown = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert shown == ["Replicas", "Ready", "Models loaded", "Unschedulable", "Age"]
    # Empty while every replica pod has a node; else what they lack (status.unschedulable).
    assert columns["Unschedulable"]["jsonPath"] == ".status.unschedulable"
    assert columns["Replicas"]["jsonPath"] == ".status.replicas"  # an autoscaled deployment has no spec.replicas
    assert columns["Ready"]["jsonPath"] == ".status.readyReplicas"
    assert columns["Models loaded"]["jsonPath"] == ".status.loadedModels"
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _aliases(model) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


@pytest.mark.parametrize(
    "path, model",
    [
        ((), DeploymentSpec),
        (("modelSource",), ModelSource),
        (("multiplexing",), Multiplexing),
        (("batching",), Batching),
        (("router",), RouterSpec),
        (("metrics",), Metrics),
        (("autoscaling",), Autoscaling),
        (("router", "loadQuota"), LoadQuota),
        (("models", "items"), ModelEntry),
    ],
)
def test_every_spec_field_and_only_those(spec_schema, path, model):
    schema = spec_schema
    for part in path:
        schema = schema[part] if part == "items" else schema["properties"][part]
    assert set(schema["properties"]) == _aliases(model)


def _required(model) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items() if field.is_required()}


def test_required_fields_match(spec_schema):
    assert set(spec_schema["required"]) == _required(DeploymentSpec) == {"image"}
    assert set(spec_schema["properties"]["modelSource"]["required"]) == _required(ModelSource) == {"uri"}


def _default(spec_schema, *path):
    schema = spec_schema
    for part in path:
        schema = schema["properties"][part]
    return schema.get("default", "<none>")


def test_defaults_are_the_spec_defaults(spec_schema):
    spec = parse_spec({"image": "x", "handler": "m:C"})
    # No default: unset replicas means 1, or the autoscaler's count (set, they refuse autoscaling).
    assert _default(spec_schema, "replicas") == "<none>" and spec.replicas is None and spec.starting_replicas == 1
    autoscaling = parse_spec({"image": "x", "handler": "m:C", "autoscaling": {}}).autoscaling
    for name, field in Autoscaling.model_fields.items():
        if field.alias != "initialReplicas":
            assert _default(spec_schema, "autoscaling", field.alias) == getattr(autoscaling, name), field.alias
    assert _default(spec_schema, "autoscaling", "initialReplicas") == "<none>"
    assert _default(spec_schema, "maxOngoingRequests") == spec.max_ongoing_requests == DEFAULT_MAX_ONGOING_REQUESTS
    assert _default(spec_schema, "maxRequestBytes") == spec.max_request_bytes
    assert _default(spec_schema, "multiplexing", "matchingTimeoutSeconds") == DEFAULT_MATCHING_TIMEOUT_S
    assert _default(spec_schema, "router", "replicas") == spec.router.replicas
    assert _default(spec_schema, "router", "port") == spec.router.port
    # Unset gRPC port: 8001 in pods, a free one in local mode; a default would hide that.
    assert _default(spec_schema, "router", "grpcPort") == "<none>" and spec.router.grpc_port is None
    # Unset control port: 9091 in pods, a free one in local mode.
    assert _default(spec_schema, "router", "controlPort") == "<none>" and spec.router.control_port is None
    assert _default(spec_schema, "router", "streamIdleTimeoutSeconds") == spec.router.stream_idle_timeout_seconds
    assert _default(spec_schema, "metrics", "modelLabel") is spec.metrics.model_label is False
    # Unset sizes mean "the decorator's argument": no default may hide that.
    assert _default(spec_schema, "multiplexing", "maxModelsPerReplica") == "<none>"
    assert _default(spec_schema, "batching", "maxBatchSize") == "<none>"
    assert _default(spec_schema, "batching", "batchWaitTimeoutMs") == "<none>"


def _constraint(model, name: str, kind: str):
    for item in model.model_fields[name].metadata:
        if hasattr(item, kind):
            return getattr(item, kind)
    return None


@pytest.mark.parametrize(
    "path, model, field",
    [
        (("replicas",), DeploymentSpec, "replicas"),
        (("maxOngoingRequests",), DeploymentSpec, "max_ongoing_requests"),
        (("maxRequestBytes",), DeploymentSpec, "max_request_bytes"),
        (("multiplexing", "maxModelsPerReplica"), Multiplexing, "max_models_per_replica"),
        (("multiplexing", "matchingTimeoutSeconds"), Multiplexing, "matching_timeout_seconds"),
        (("batching", "maxBatchSize"), Batching, "max_batch_size"),
        (("batching", "batchWaitTimeoutMs"), Batching, "batch_wait_timeout_ms"),
        (("router", "replicas"), RouterSpec, "replicas"),
        (("router", "port"), RouterSpec, "port"),
        (("router", "grpcPort"), RouterSpec, "grpc_port"),
        (("router", "controlPort"), RouterSpec, "control_port"),
        (("autoscaling", "minReplicas"), Autoscaling, "min_replicas"),
        (("autoscaling", "maxReplicas"), Autoscaling, "max_replicas"),
        (("autoscaling", "initialReplicas"), Autoscaling, "initial_replicas"),
        (("autoscaling", "upscaleDelaySeconds"), Autoscaling, "upscale_delay_seconds"),
        (("autoscaling", "downscaleDelaySeconds"), Autoscaling, "downscale_delay_seconds"),
    ],
)
def test_ranges_match(spec_schema, path, model, field):
    schema = spec_schema
    for part in path:
        schema = schema["properties"][part]
    assert schema.get("minimum") == _constraint(model, field, "ge")
    assert schema.get("maximum") == _constraint(model, field, "le")
    annotation = model.model_fields[field].annotation
    expected = "integer" if int in getattr(annotation, "__args__", (annotation,)) else "number"
    assert schema["type"] == expected


def test_handler_pattern_is_the_spec_pattern(spec_schema):
    from modelplex.wire import spec as spec_module

    assert spec_schema["properties"]["handler"]["pattern"] == spec_module._HANDLER.pattern


def test_status_schema_holds_what_the_operator_writes(version):
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"replicas", "readyReplicas", "updatedReplicas", "loadedModels", "routerService", "selector",
            "observedGeneration", "conditions"} <= set(status)
    cond = status["conditions"]
    assert cond["x-kubernetes-list-type"] == "map" and cond["x-kubernetes-list-map-keys"] == ["type"]


def test_status_schema_holds_every_field_of_a_computed_status(version):
    from modelplex.wire.loaded import LoadedModels, LoadedSummary
    from modelplex.wire.spec import parse_spec
    from modelplex_operator.status import MAX_STATUS_HOLDERS, MAX_STATUS_MODELS, PodView, Resource, compute_status

    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    pods = [PodView("p", True, False, LoadedSummary(models=1, bytes=5, capacity_bytes=10))]
    declared = {"image": "recs:1", "handler": "recs:Recs", "models": [{"match": "m", "minCopies": 1}]}
    status = compute_status(Resource("recs", "team-a", spec=parse_spec(declared)), [], pods, None, "2026-01-01T00:00:00Z",
                            {"p": LoadedModels(models=("m",), model_bytes={"m": 5})}, {"p": "timeout"})
    assert set(status) <= set(schema), set(status) - set(schema)
    item = schema["models"]["items"]["properties"]
    assert set(status["models"][0]) == set(item)
    assert str(MAX_STATUS_MODELS) in schema["models"]["description"]
    assert f"first {MAX_STATUS_HOLDERS}" in item["replicas"]["description"]
