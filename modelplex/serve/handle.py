"""``from modelplex.serve.handle import DeploymentHandle``, where Ray Serve users look for it."""

from modelplex.handles import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator"]
