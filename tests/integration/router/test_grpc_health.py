"""gRPC health follows readiness at once (#37): from the moment ``/readyz`` says ready, a Check
of ``inference.GRPCInferenceService`` says ``SERVING`` (it used to follow on a one-second poll)."""

from __future__ import annotations

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT = aiohttp.ClientTimeout(total=5)


async def test_the_inference_service_is_serving_the_moment_the_router_is_ready(plex):
    grpc_port = plex.free_port()
    manifest = plex.write_manifest(replicas=1, spec={"router": {"grpcPort": grpc_port}})
    replica_port, router_port = plex.free_port(), plex.free_port()
    plex.processes.replica(manifest, replica_port)
    router = plex.processes.router(manifest, router_port, [f"r0=http://127.0.0.1:{replica_port}"])
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, \
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        service = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")

        async def ready() -> bool:
            async with session.get(router.url + "/readyz") as resp:
                return resp.status == 200

        # Poll often, so that the Check follows readiness by milliseconds, not by a poll of the router's.
        await plex.wait_until(ready, interval=0.01, what="the router to be ready", guard=router.check_running)
        answer = await health.Check(service, timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert (await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)).status == \
            health_pb2.HealthCheckResponse.SERVING
