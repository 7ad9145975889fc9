"""The application graph as MultiplexedDeployments: names, options, edges (pure, no processes)."""

from __future__ import annotations

import pytest

from modelplex import serve
from modelplex.handles import DeploymentHandle
from modelplex.serve.graph import ANNOTATION_HANDLES, HandleRef, manifest, walk
from modelplex.serve.hosted import construct
from modelplex.wire.names import dns_label
from modelplex.wire.spec import parse_deployment


@serve.deployment
class Downstream:
    def __call__(self):
        return serve.get_multiplexed_model_id()


@serve.deployment(num_replicas=3, max_ongoing_requests=8, ray_actor_options={"num_gpus": 0.5, "num_cpus": 2})
class Upstream:
    def __init__(self, first, second, *, extra=None):
        self.first, self.second, self.extra = first, second, extra

    def __call__(self, request):
        return request


@pytest.mark.parametrize(("ray_name", "label"), [
    ("SimpleModel", "simple-model"), ("ModelServer", "model-server"), ("HTTPServer", "http-server"),
    ("model_v2", "model-v2"), ("Downstream", "downstream"), ("ABC", "abc"),
])
def test_ray_class_names_become_dns_labels(ray_name, label):
    assert dns_label(ray_name) == label


def test_a_name_without_letters_or_digits_is_refused():
    with pytest.raises(ValueError, match="no letter or digit"):
        dns_label("__")


def test_the_ingress_comes_first_and_bound_arguments_become_handle_references():
    shared = Downstream.bind()
    nodes = walk(Upstream.bind(shared, shared, extra=Downstream.bind()))
    assert [node.name for node in nodes] == ["upstream", "downstream", "downstream-1"]
    assert nodes[0].args == (HandleRef("downstream"), HandleRef("downstream"))
    assert nodes[0].kwargs == {"extra": HandleRef("downstream-1")}
    assert nodes[0].edges == ["downstream", "downstream-1"]


def test_options_become_the_spec_and_edges_an_annotation():
    nodes = walk(Upstream.bind(Downstream.bind(), 7))
    document = manifest(nodes[0], image="registry.local/app:1", handler="app:Upstream")
    assert document["metadata"] == {"name": "upstream", "annotations": {ANNOTATION_HANDLES: "downstream"}}
    spec = document["spec"]
    assert spec["replicas"] == 3
    assert spec["maxOngoingRequests"] == 8
    assert spec["resources"] == {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": 1}}
    parsed = parse_deployment(document)  # what the operator will accept
    assert parsed.spec.replicas == 3 and parsed.spec.handler == "app:Upstream"


def test_options_returns_a_changed_copy_and_autoscaling_sets_the_first_replica_count():
    scaled = Downstream.options(name="Reader", autoscaling_config={"min_replicas": 2, "max_replicas": 5})
    node = walk(scaled.bind())[0]
    assert node.name == "reader" and node.options.replicas() == 2
    assert walk(Downstream.bind())[0].options.replicas() == 1


def test_unsupported_options_are_named():
    with pytest.raises(TypeError, match="placement_group_bundles"):
        serve.deployment(placement_group_bundles=[{}])
    with pytest.raises(ValueError, match="'TPU': a pod's limits name extended resources as domain/name"):
        Downstream.options(ray_actor_options={"resources": {"TPU": 1}})  # Ray's custom resource: no pod limit
    with pytest.raises(ValueError, match="max_ongoing_requests"):
        Downstream.options(max_ongoing_requests=0)


def test_a_deployment_cannot_be_constructed_directly():
    with pytest.raises(TypeError, match=r"Downstream.bind"):
        Downstream()


def test_the_replica_builds_the_class_with_handles_for_bound_deployments(monkeypatch):
    monkeypatch.setenv("MODELPLEX_ROUTER_DOWNSTREAM", "http://127.0.0.1:8001")
    node = walk(Upstream.bind(Downstream.bind(), [1, 2], extra={"h": Downstream.bind()}))[0]
    monkeypatch.setenv("MODELPLEX_ROUTER_DOWNSTREAM_1", "http://127.0.0.1:8002")
    instance = construct(node.target, node.args, node.kwargs)
    assert isinstance(instance.first, DeploymentHandle)
    assert (instance.first.deployment, instance.first.url) == ("downstream", "http://127.0.0.1:8001")
    assert instance.second == [1, 2]
    assert instance.extra["h"].url == "http://127.0.0.1:8002"


def test_user_config_reaches_reconfigure():
    class Configured:
        def __init__(self):
            self.threshold = None

        async def reconfigure(self, config):
            self.threshold = config["threshold"]

    assert construct(Configured, (), {}, {"threshold": 0.7}).threshold == 0.7
    with pytest.raises(TypeError, match="no reconfigure"):
        construct(Upstream.func_or_class, (1, 2), {}, {"threshold": 0.7})
