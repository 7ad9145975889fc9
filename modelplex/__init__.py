"""Modelplex: serve many PyTorch models from a shared pool of replicas on Kubernetes.

The user SDK mirrors Ray Serve's::

    from modelplex import multiplexed, batch, get_multiplexed_model_id
"""

from modelplex.batching import batch
from modelplex.context import get_multiplexed_model_id
from modelplex.handles import DeploymentHandle, handle
from modelplex.multiplex import multiplexed
from modelplex.wire.ids import safe_join as safe_join  # ids into paths for user loaders, never outside

__all__ = ["DeploymentHandle", "batch", "get_multiplexed_model_id", "handle", "multiplexed"]
__version__ = "0.1.0"
