"""Ray Serve's "Combining Optimization Techniques" example (seeds: performance optimization):
multiplexing and batching in one deployment.

The deployment is Ray's code with only the imports changed. The seed leaves
``load_model_from_storage`` to the reader: here it builds a small torch model whose weights the
model id seeds, a stand-in for weights in a blob store. ``main()`` sends eight requests to each
of two models at once and checks every answer against the model run alone.
"""

import asyncio

import torch

from modelplex import serve


class TinyModel(torch.nn.Module):
    def __init__(self, model_id: str):
        super().__init__()
        generator = torch.Generator().manual_seed(sum(map(ord, model_id)))
        self.linear = torch.nn.Linear(4, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(1, 4, generator=generator))
            self.linear.bias.zero_()

    @torch.inference_mode()
    def predict_batch(self, requests: list) -> list:
        return self.linear(torch.tensor(requests, dtype=torch.float32)).squeeze(1).tolist()


def load_model_from_storage(model_id: str) -> TinyModel:
    return TinyModel(model_id)


@serve.deployment
class OptimizedPipeline:
    @serve.multiplexed(max_num_models_per_replica=5)
    async def load_model(self, model_id: str):
        return load_model_from_storage(model_id)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.1)
    async def __call__(self, requests: list) -> list:
        model_id = serve.get_multiplexed_model_id()
        model = await self.load_model(model_id)
        results = model.predict_batch(requests)
        return results


async def main():
    handle = serve.run(OptimizedPipeline.bind())
    inputs = [[float(i), 1.0, -1.0, 0.5 * i] for i in range(8)]
    models = ["customer-a", "customer-b"]
    responses = {m: [handle.options(multiplexed_model_id=m).remote(x) for x in inputs] for m in models}
    for model_id in models:
        answers = [await response for response in responses[model_id]]
        expected = load_model_from_storage(model_id).predict_batch(inputs)
        assert all(abs(a - e) < 1e-5 for a, e in zip(answers, expected)), (model_id, answers, expected)
    print(f"{len(models) * len(inputs)} answers match their models")


asyncio.run(main())
