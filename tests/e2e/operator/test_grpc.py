"""The Open Inference Protocol over gRPC end to end: the operator's router pods serve it on
``spec.router.grpcPort`` (default 8001), their gRPC health service serving as their readiness
(which the kubelet reads on the control port), and a Triton gRPC client infers through the
router Service's ClusterIP."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes import client

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import kubectl_apply, manifest, pods, router_url, wait_settled

pytestmark = pytest.mark.e2e


def test_a_grpc_infer_through_the_router_service(control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "tensors"
    kubectl_apply(control_plane, ns, manifest(name, replicas=1, handler="mxd_handler:Tensors", batching={}))
    wait_settled(api, ns, name, replicas=1)
    probe = pods(api, ns, name, role="router")[0].spec.containers[0].readiness_probe
    # The kubelet asks the control port (wait_settled saw the pods ready); gRPC health says the same (below).
    assert (probe.http_get.port, probe.http_get.path) == ("control", "/readyz")

    router_url(control_plane, ns, name)  # the Service has a ready endpoint and kube-proxy's rules
    svc = client.CoreV1Api(api).read_namespaced_service(name, ns)
    (port,) = [p.port for p in svc.spec.ports if p.name == "grpc"]
    assert port == 8001
    with triton.InferenceServerClient(f"{svc.spec.cluster_ip}:{port}") as grpc_client:
        def ready() -> bool:
            try:
                return grpc_client.is_server_ready(client_timeout=5)
            except triton.InferenceServerException:
                return False

        wait_for(ready, timeout=120, what=f"gRPC ServerReady through Service {ns}/{name}")
        with grpc.insecure_channel(f"{svc.spec.cluster_ip}:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        rows = np.arange(8, dtype=np.float32).reshape(2, 4)
        tensor = triton.InferInput("x", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        result = grpc_client.infer("model-7", [tensor], request_id="e2e-1", client_timeout=60)
    assert result.get_response().id == "e2e-1"
    np.testing.assert_array_equal(result.as_numpy("x_doubled"), rows * 2)
    assert result.as_numpy("pod")[0].decode() in {p.metadata.name for p in pods(api, ns, name)}
