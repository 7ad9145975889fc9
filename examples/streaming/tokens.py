"""A streaming handler: an async generator yields chunks, the client receives each as it comes."""

import asyncio

from modelplex import get_multiplexed_model_id


class Tokens:
    async def __call__(self, body: dict):
        count = int(body.get("count", 10)) if isinstance(body, dict) else 10
        for index in range(count):
            await asyncio.sleep(0.05)  # stands in for one decoding step
            yield {"model": get_multiplexed_model_id(), "token": index}
