"""Ray Serve's "Dynamic Request Batching" example, without batching (seeds: performance optimization, 1).

Only the imports differ from Ray's code; the notebook's top-level ``await`` is inside ``main()``.
"""

import asyncio

from modelplex import serve


@serve.deployment
class SimpleModel:
    def run(self, single_sample: int) -> int:
        return single_sample * 2


async def main():
    handle = serve.run(SimpleModel.bind())
    print(await handle.run.remote(1))  # Returns 2


asyncio.run(main())
