"""A deployment whose user code tries another deployment's internal API (``TARGET``): through a
handle (a call, a method) and straight at a replica with its own deployment's credential."""

from __future__ import annotations

import os

import aiohttp

from modelplex import get_multiplexed_model_id, handle
from modelplex.wire.errors import ModelplexError


class Front:
    def __init__(self) -> None:
        self.target = handle(os.environ["TARGET"])

    async def __call__(self, request: dict) -> dict:
        target = self.target.options(multiplexed_model_id=get_multiplexed_model_id())
        try:
            if request.get("do") == "replica":  # its own credential, at the target's replica
                with open(os.environ["MODELPLEX_INTERNAL_TOKEN_FILE"]) as file:
                    token = file.read().strip()
                async with aiohttp.ClientSession() as session:
                    async with session.get(request["url"] + "/v1/models",
                                           headers={"X-Modelplex-Internal-Token": token}) as answer:
                        return {"status": answer.status}
            if request.get("do") == "method":
                return {"status": 200, "answer": await target.set_greeting.remote(request["greeting"])}
            return {"status": 200, "answer": await target.remote({})}
        except ModelplexError as error:
            return {"status": error.status, "error": str(error)}
