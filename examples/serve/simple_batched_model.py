"""Ray Serve's "Dynamic Request Batching" example with ``@serve.batch`` (seeds: performance optimization, 1).

Eight single-sample calls are sent at once; the replica runs them in batches of at most 4, and
each caller gets its own answer, in order. Only the imports differ from Ray's code; the
notebook's top-level ``await`` is inside ``main()``.
"""

import asyncio

from modelplex import serve


@serve.deployment
class SimpleBatchedModel:
    @serve.batch(batch_wait_timeout_s=0.1, max_batch_size=4)
    async def run(self, multiple_samples: list[int]) -> list[int]:
        print(f"{multiple_samples=}")
        return [sample * 2 for sample in multiple_samples]


async def main():
    handle = serve.run(SimpleBatchedModel.bind())
    responses = [handle.run.remote(i) for i in range(8)]

    for i, resp in enumerate(responses):
        resp_val = await resp
        assert resp_val == i * 2
    print("all eight answers in order")


asyncio.run(main())
