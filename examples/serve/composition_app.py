"""The Upstream/Downstream composition as an application to build or run by name, as Ray's
``serve run app:app`` / ``serve build`` take it:

    modelplex local examples/serve/composition_app.py:app
    modelplex build examples/serve/composition_app.py:app --image my-registry/app:1 -o app.yaml

The module only binds the graph: replicas import it to build their deployment.
"""

import starlette.requests

from modelplex import serve
from modelplex.serve.handle import DeploymentHandle


@serve.deployment
class Downstream:
    def __call__(self):
        return serve.get_multiplexed_model_id()


@serve.deployment(num_replicas=2, max_ongoing_requests=16, ray_actor_options={"num_cpus": 1})
class Upstream:
    def __init__(self, downstream: DeploymentHandle):
        self._h = downstream

    async def __call__(self, request: starlette.requests.Request):
        return await self._h.options(multiplexed_model_id="bar").remote()


app = Upstream.bind(Downstream.bind())
