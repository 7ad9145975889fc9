"""A handler for local mode's Envoy test: it says which model it served and echoes the body."""

from modelplex import get_multiplexed_model_id, multiplexed


class Echo:
    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> dict:
        return {"id": model_id}

    async def __call__(self, body):
        model = await self.load_model(get_multiplexed_model_id())
        return {"model": model["id"], "echo": body}
