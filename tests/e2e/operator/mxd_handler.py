"""The model handler of the operator's end-to-end tests (no torch: quick to start on two cores).

The replica pods import it by name: it is copied into the e2e replica image (conftest.py) and
the test's manifest puts its folder on ``PYTHONPATH`` through ``spec.env``. Each answer says
which pod served it and with which batching settings, so a test can tell where a request went
and that a spec change reached the pods. ``Caller`` calls another deployment through a handle,
which a pod resolves by cluster DNS (``http://<name>.<namespace>.svc:8000``).
``Sized`` has models of known sizes and ids that fail to load (the cache status tests).
"""

from __future__ import annotations

import asyncio
import os
import time

from modelplex import batch, get_multiplexed_model_id, handle, multiplexed
from modelplex.runtime import current_runtime


class Echo:
    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> dict:
        await asyncio.sleep(0.05)
        return {"id": model_id, "pod": os.environ.get("POD_NAME", "")}

    @batch(max_batch_size=4, batch_wait_timeout_s=0.005)
    async def __call__(self, requests: list) -> list:
        model = await self.load_model(get_multiplexed_model_id())
        return [
            {
                "model": model["id"],
                "pod": os.environ.get("POD_NAME", ""),
                "max_batch_size": current_runtime().max_batch_size,
                "echo": request,
            }
            for request in requests
        ]


class Caller:
    def __init__(self):
        self.target = handle(os.environ["TARGET_DEPLOYMENT"])

    async def __call__(self, request):
        target = self.target.options(multiplexed_model_id=get_multiplexed_model_id())
        return {"caller": os.environ.get("POD_NAME", ""), "url": self.target.url,
                "answer": await target.remote(request)}


class Slow:
    """Synchronous work inside ``async def`` (as users write it), so a replica is busy for
    ``work_s`` per request. Each answer says whether its model was already loaded when the
    request arrived (a cache hit): pre-loaded models answer ``hit: true`` from the start."""

    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> dict:
        await asyncio.sleep(0.05)
        return {"id": model_id, "loaded_at": time.time()}

    async def __call__(self, request: dict) -> dict:
        arrived = time.time()
        model = await self.load_model(get_multiplexed_model_id())
        time.sleep(float((request or {}).get("work_s", 0)))
        return {"model": model["id"], "pod": os.environ.get("POD_NAME", ""), "hit": model["loaded_at"] < arrived}


class Sized:
    """Models with a size the cache counts (``model_bytes``: 1000 bytes per character of the id),
    and ids starting with ``broken`` whose load fails, as a missing weights file does."""

    @multiplexed(max_num_models_per_replica=4)
    async def load_model(self, model_id: str) -> dict:
        await asyncio.sleep(0.05)
        if model_id.startswith("broken"):
            raise FileNotFoundError(f"no weights for {model_id}")
        return {"id": model_id, "bytes": 1000 * len(model_id)}

    def model_bytes(self, model: dict) -> int:
        return model["bytes"]

    async def __call__(self, request):
        model = await self.load_model(get_multiplexed_model_id())
        return {"model": model["id"], "pod": os.environ.get("POD_NAME", "")}


class Tensors:
    """Open Inference Protocol tensors (the gRPC test): each input doubled, and which pod answered."""

    async def __call__(self, request):
        import numpy as np

        outputs = {f"{name}_doubled": array * 2 for name, array in request.inputs.items()}
        outputs["pod"] = np.array([os.environ.get("POD_NAME", "").encode()], dtype=object)
        return outputs


class Configured:
    """Ray's ``user_config``: ``reconfigure`` sets the greeting each answer carries and counts its
    calls; an empty greeting raises, as a bad config does."""

    def __init__(self):
        self.greeting = "unset"
        self.reconfigured = 0

    def reconfigure(self, config: dict) -> None:
        if not config.get("greeting"):
            raise ValueError("the greeting must not be empty")
        self.greeting = config["greeting"]
        self.reconfigured += 1

    async def __call__(self, request) -> dict:
        return {"greeting": self.greeting, "reconfigured": self.reconfigured, "pod": os.environ.get("POD_NAME", "")}
