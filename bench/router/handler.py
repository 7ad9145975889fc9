"""The benchmark's model handler: a load costs ``BENCH_LOAD_S`` (weights coming in), an
inference ``BENCH_INFER_S`` (a GPU kernel: the event loop stays free, as it would)."""

from __future__ import annotations

import asyncio
import os

from modelplex import get_multiplexed_model_id, multiplexed

LOAD_S = float(os.environ.get("BENCH_LOAD_S", "0.1"))
INFER_S = float(os.environ.get("BENCH_INFER_S", "0.002"))


class BenchModel:
    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> str:
        await asyncio.sleep(LOAD_S)
        return model_id

    async def __call__(self, body):
        model = await self.load_model(get_multiplexed_model_id())
        if INFER_S:
            await asyncio.sleep(INFER_S)
        return {"model": model}
