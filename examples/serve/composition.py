"""Ray Serve's model composition with a multiplexed downstream (seeds: model multiplexing).

``Upstream`` receives a handle to ``Downstream`` in its constructor and calls it for model
"bar"; the answer is the model id the downstream saw. Only the imports differ from Ray's code.
"""

import requests
import starlette.requests

from modelplex import serve
from modelplex.serve.handle import DeploymentHandle


@serve.deployment
class Downstream:
    def __call__(self):
        return serve.get_multiplexed_model_id()


@serve.deployment
class Upstream:
    def __init__(self, downstream: DeploymentHandle):
        self._h = downstream

    async def __call__(self, request: starlette.requests.Request):
        return await self._h.options(multiplexed_model_id="bar").remote()


serve.run(Upstream.bind(Downstream.bind()))
resp = requests.get("http://localhost:8000")
print(resp.status_code, resp.text)
