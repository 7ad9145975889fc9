"""Ray Serve's application API: ``from modelplex import serve`` where Ray code says ``from ray import serve``.

    @serve.deployment(num_replicas=2, ray_actor_options={"num_gpus": 1})
    class Upstream:
        def __init__(self, downstream: DeploymentHandle): ...

    handle = serve.run(Upstream.bind(Downstream.bind()))
    await handle.remote()

``serve.run`` runs the graph here, as ``modelplex local`` does; ``modelplex build app.py:app``
writes the same graph as MultiplexedDeployments for a cluster.
"""

try:
    # Under Ray, Serve's HTTP layer has imported Starlette's requests module, and Ray's documents
    # rely on it: `import starlette` then `request: starlette.requests.Request`.
    import starlette.requests  # noqa: F401
except ImportError:  # Starlette comes with the ingress extra; a script that names it has it
    pass

from modelplex.batching import batch
from modelplex.context import get_multiplexed_model_id, get_replica_context
from modelplex.multiplex import multiplexed
from modelplex.serve import config, exceptions, schema
from modelplex.serve.config import AutoscalingConfig, HTTPOptions, LoggingConfig
from modelplex.serve.deployment import Application, Deployment, deployment
from modelplex.serve.ingress import ingress
from modelplex.serve.running import delete, get_app_handle, get_deployment_handle, run, shutdown, start, status

__all__ = [
    "Application", "AutoscalingConfig", "Deployment", "HTTPOptions", "LoggingConfig", "batch", "config", "delete",
    "deployment", "exceptions", "get_app_handle", "get_deployment_handle", "get_multiplexed_model_id",
    "get_replica_context", "ingress", "multiplexed", "run", "schema", "shutdown", "start", "status",
]
