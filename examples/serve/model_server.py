"""Ray Serve's multiplexing example (seeds: performance optimization, 2): ``ModelServer`` keeps
at most two models per replica; a third evicts the least recently used.

Differences from Ray's code: the imports; the notebook's top-level ``await`` is inside
``main()``; and ``predict`` is ``async def`` (awaited by ``__call__``): the seed's ``def predict``
holds an ``await``, which Python refuses to compile.
"""

import asyncio

import requests

from modelplex import serve


@serve.deployment
class ModelServer:
    # specify the size of the cache
    @serve.multiplexed(max_num_models_per_replica=2)
    async def load_model(self, model_id: str):
        return await self.load_model_from_storage(model_id)

    async def __call__(self, request):
        # fetch the model id associated with this request
        model_id = serve.get_multiplexed_model_id()
        model = await self.load_model(model_id)
        return await self.predict(model, request)

    async def load_model_from_storage(self, model_id):
        print(f"loading {model_id=} from blob store")
        await asyncio.sleep(0.1)  # simulate download weights from S3/GCS
        return model_id

    async def predict(self, model, request):
        await asyncio.sleep(0.05)  # simulate loading data onto device and running inference
        return f"prediction from {model}"


handle = serve.run(ModelServer.bind())


async def main():
    print(await handle.options(multiplexed_model_id="model_v1").remote({"simple": "request"}))


asyncio.run(main())

response = requests.post(
    "http://localhost:8000/",
    json={"data": [1, 2, 3]},
    headers={"serve_multiplexed_model_id": "model_v2"}
)
print(response.text)

# model_v1 and model_v2 fill the cache: model_v3 evicts model_v1, the least recently used.
response = requests.post(
    "http://localhost:8000/",
    json={"data": [1, 2, 3]},
    headers={"serve_multiplexed_model_id": "model_v3"}
)
print(response.text)
