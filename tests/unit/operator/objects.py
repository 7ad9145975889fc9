"""Objects for the operator's unit tests (imported as ``unit.operator.objects``; pythonpath=tests)."""

from __future__ import annotations

import copy

from modelplex.wire.spec import parse_deployment

UID = "0b5c1f5e-2d7a-4a4e-9a57-6c0c3d4b1e01"


def body(name: str = "recs", namespace: str = "team-a", generation: int = 1, **spec) -> dict:
    """A MultiplexedDeployment as the API returns it (after the CRD's defaulting)."""
    base = {
        "replicas": 2,
        "image": "registry.example.com/recs:1.4",
        "handler": "recs.models:Recommender",
        "modelSource": {"uri": "s3://models/{model_id}/model.pt", "secretRef": {"name": "s3-credentials"}},
        "multiplexing": {"maxModelsPerReplica": 3, "matchingTimeoutSeconds": 1.0, "prewarm": ["model-a"]},
        "batching": {"maxBatchSize": 8, "batchWaitTimeoutMs": 10},
        "maxOngoingRequests": 16,
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "env": [{"name": "LOG_LEVEL", "value": "info"}],
        "router": {"replicas": 1, "port": 8000},
    }
    base.update(spec)
    return {
        "apiVersion": "modelplex.io/v1alpha1",
        "kind": "MultiplexedDeployment",
        "metadata": {"name": name, "namespace": namespace, "uid": UID, "generation": generation},
        "spec": base,
    }


def deployment_of(doc: dict):
    doc = copy.deepcopy(doc)
    return parse_deployment(
        {"apiVersion": doc["apiVersion"], "kind": doc["kind"],
         "metadata": {"name": doc["metadata"]["name"], "namespace": doc["metadata"]["namespace"]},
         "spec": doc["spec"]}
    )
