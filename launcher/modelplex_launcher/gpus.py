"""GPUs a deployment asks for, against the machine local mode runs on.

On Kubernetes a pod that asks for ``nvidia.com/gpu`` where no node has one stays Pending, as
Ray's actor would; here local mode starts its replicas anyway (torch runs on the CPU), and says
so once per deployment, naming it: a GPU asked for and not there is never silent.
"""

from __future__ import annotations

import glob
import os

from modelplex.wire.spec import Deployment

GPU_RESOURCE = "nvidia.com/gpu"


def gpus_asked(deployment: Deployment) -> int:
    """The GPUs the deployment's replicas ask for (``num_gpus`` becomes this limit)."""
    limits = deployment.spec.resources.get("limits") or {}
    try:
        return int(limits.get(GPU_RESOURCE, 0))
    except (TypeError, ValueError):
        return 0


def machine_has_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU (its driver's devices), without importing torch."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.isdir("/proc/driver/nvidia/gpus")


def gpu_warning(deployment: Deployment, has_gpu: bool) -> str | None:
    """The line to say when ``deployment`` asks for GPUs this machine does not have."""
    asked = gpus_asked(deployment)
    if not asked or has_gpu:
        return None
    return (f"modelplex local: {deployment.name}: asks for {asked} GPU(s) (num_gpus, {GPU_RESOURCE}) but this "
            "machine has none: its replicas run on the CPU (on Kubernetes the pod would wait for a GPU node)")
