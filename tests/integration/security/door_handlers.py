"""Handlers for the "one door" tests: a multiplexed model server that says which model it served
(its loader knows every id but ``bogus-*`` ones), and a ``serve.ingress`` app that echoes what
its ASGI scope holds, as an app that logs or echoes its headers would."""

from __future__ import annotations

import json

from modelplex import get_multiplexed_model_id, multiplexed
from modelplex.serve.ingress import ingress


class Served:
    @multiplexed(max_num_models_per_replica=16)
    async def load_model(self, model_id: str) -> str:
        if model_id.startswith("bogus-"):
            raise KeyError(f"no model {model_id!r}")
        return model_id

    async def __call__(self, request: object) -> dict:
        return {"served": await self.load_model(get_multiplexed_model_id())}


async def echo_scope(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    body = json.dumps({"headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
                       "query": scope["query_string"].decode("latin-1"), "path": scope["path"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@ingress(echo_scope)
class Echo:
    pass
