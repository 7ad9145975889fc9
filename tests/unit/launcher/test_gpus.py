"""A deployment asking for GPUs on a machine without one (issue 40, item 7): local mode says so
once, naming the deployment and num_gpus, instead of running on the CPU silently."""

from __future__ import annotations

from modelplex import serve
from modelplex.serve.graph import manifest, walk
from modelplex.wire.spec import parse_deployment
from modelplex_launcher.gpus import gpu_warning, gpus_asked


@serve.deployment(ray_actor_options={"num_gpus": 1})
class OnGpu:
    pass


@serve.deployment
class OnCpu:
    pass


def deployment(app):
    return parse_deployment(manifest(walk(app.bind())[0], image="x", handler="m:H"))


def test_a_deployment_with_num_gpus_on_a_machine_without_a_gpu_is_named_in_a_warning():
    on_gpu = deployment(OnGpu)
    assert gpus_asked(on_gpu) == 1
    assert gpu_warning(on_gpu, has_gpu=False) == (
        "modelplex local: on-gpu: asks for 1 GPU(s) (num_gpus, nvidia.com/gpu) but this machine has none: its "
        "replicas run on the CPU (on Kubernetes the pod would wait for a GPU node)")
    assert gpu_warning(on_gpu, has_gpu=True) is None
    assert gpu_warning(deployment(OnCpu), has_gpu=False) is None
