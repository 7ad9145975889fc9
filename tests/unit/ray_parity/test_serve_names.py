"""The names a Ray Serve user reaches for (issue 40, item 2): ``serve.exceptions`` raised where Ray
raises them, ``serve.get_replica_context()`` (in a ``@multiplexed`` loader too),
``serve.config.AutoscalingConfig``, ``serve.HTTPOptions`` and ``serve.start``'s refusals,
``serve.get_app_handle``'s error. Handles call a real replica app on loopback."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestServer

import modelplex.context
from modelplex import serve
from modelplex.handles import handle
from modelplex.serve.exceptions import (BackPressureError, DeploymentUnavailableError, RayServeException,
                                        RequestCancelledError)
from modelplex.serve.graph import ENV_APPLICATION, ENV_DEPLOYMENT, manifest, walk
from modelplex.serve.hosted import construct, replica_context
from modelplex.wire.errors import NotReady, Overloaded, error_for_status
from modelplex.wire.spec import parse_deployment
from modelplex_replica.app import create_app


def deployment(**spec):
    return parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                             "metadata": {"name": "slow"}, "spec": {"image": "x", "handler": "m:H", **spec}})


class Slow:
    def __init__(self):
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def wait(self) -> str:
        self.started.set()
        await self.release.wait()
        return "done"


@pytest.fixture
async def slow():
    instance = Slow()
    server = TestServer(create_app(deployment(maxOngoingRequests=1), instance), host="127.0.0.1")
    await server.start_server()
    try:
        yield instance, handle("slow", url=str(server.make_url(""))).options(path="/v1/invoke")
    finally:
        instance.release.set()
        await server.close()


async def test_a_call_to_a_full_deployment_raises_rays_back_pressure_error(slow):
    instance, slow_handle = slow
    first = slow_handle.wait.remote()
    await asyncio.wait_for(instance.started.wait(), 30)
    with pytest.raises(BackPressureError) as raised:
        await slow_handle.wait.remote()
    assert isinstance(raised.value, RayServeException) and isinstance(raised.value, Overloaded)
    instance.release.set()
    assert await first == "done"


async def test_awaiting_a_cancelled_response_raises_rays_request_cancelled_error(slow):
    instance, slow_handle = slow
    response = slow_handle.wait.remote()
    await asyncio.wait_for(instance.started.wait(), 30)
    response.cancel()
    with pytest.raises(RequestCancelledError):
        await response


def test_a_deployment_with_no_ready_replica_is_rays_deployment_unavailable_error():
    error = error_for_status(503, "no replica ready", NotReady.code)
    assert isinstance(error, DeploymentUnavailableError) and isinstance(error, NotReady)
    assert isinstance(error, RayServeException)


@serve.deployment
class Multiplexed:
    def __init__(self):
        self.built_in = serve.get_replica_context().deployment  # Ray allows it in the constructor

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        context = serve.get_replica_context()
        return (model_id, context.deployment, context.app_name, context.servable_object is self)


async def test_the_replica_context_is_there_in_the_constructor_and_in_a_multiplexed_loader(monkeypatch):
    monkeypatch.setattr(modelplex.context, "_replica_context", None)  # this test's own, undone after it
    monkeypatch.setenv(ENV_DEPLOYMENT, "Multiplexed")
    monkeypatch.setenv(ENV_APPLICATION, "app1")
    context = replica_context("multiplexed")
    instance = construct(Multiplexed.func_or_class, (), {}, context=context)
    assert instance.built_in == "Multiplexed"
    assert await instance.get_model("m1") == ("m1", "Multiplexed", "app1", True)
    assert context.replica_tag.startswith("Multiplexed#")


def test_outside_a_deployment_the_replica_context_is_rays_error():
    from modelplex.context import set_replica_context

    set_replica_context(None)
    with pytest.raises(RayServeException, match="may only be called from within a Ray Serve deployment"):
        serve.get_replica_context()


def test_an_autoscaling_config_object_is_taken_as_its_fields():
    @serve.deployment(autoscaling_config=serve.config.AutoscalingConfig(min_replicas=0, max_replicas=4,
                                                                        target_ongoing_requests=3))
    class Scaled:
        pass

    scaling = Scaled.deployment_options.replica_spec()["autoscaling"]
    assert (scaling["minReplicas"], scaling["maxReplicas"], scaling["targetOngoingRequests"]) == (0, 4, 3)


def test_http_options_take_host_and_port_and_refuse_the_rest_by_name():
    assert serve.HTTPOptions.of({"port": 8123}).port == 8123
    with pytest.raises(ValueError, match="root_path"):
        serve.HTTPOptions(root_path="/api")
    with pytest.raises(TypeError, match="grpc_options"):
        serve.start(grpc_options={"port": 9000})
    with pytest.raises(TypeError, match="unknown field"):
        serve.start(http_options={"prot": 8000})


def test_an_application_that_does_not_exist_has_no_app_handle():
    with pytest.raises(RayServeException, match="Application 'missing' does not exist."):
        serve.get_app_handle("missing")


def test_production_options_land_in_the_manifest():
    @serve.deployment(graceful_shutdown_timeout_s=45, graceful_shutdown_wait_loop_s=2,
                      ray_actor_options={"num_cpus": 1, "resources": {"example.com/fpga": 1.5},
                                         "runtime_env": {"env_vars": {"MODE": "fast"}}})
    class Production:
        pass

    document = manifest(walk(Production.bind())[0], image="img", handler="m:H")
    spec = document["spec"]
    assert spec["gracefulShutdownTimeoutSeconds"] == 45
    assert spec["resources"] == {"requests": {"cpu": "1"}, "limits": {"example.com/fpga": 2}}
    assert {"name": "MODE", "value": "fast"} in spec["env"]
    parse_deployment({**document, "metadata": {"name": "production"}})  # a manifest the operator takes


@pytest.mark.parametrize("actor, message", [
    ({"runtime_env": {"pip": ["torch"]}}, "runtime_env pip not supported: a replica runs in its image"),
    ({"runtime_env": {"working_dir": ".", "conda": "env"}}, "runtime_env conda, working_dir not supported"),
    ({"resources": {"fpga": 1}}, "domain/name"),
])
def test_what_a_replica_cannot_be_given_is_refused_by_name(actor, message):
    with pytest.raises((TypeError, ValueError), match=message):
        serve.deployment(ray_actor_options=actor)
