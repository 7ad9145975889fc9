"""The replica's side of the Open Inference Protocol: decode the router's forwarded bodies into
:class:`~modelplex.wire.oip.InferRequest` for the handler, encode what it returns, and answer
model metadata.

The router marks an OIP request with ``X-Modelplex-Protocol: oip-v2`` on ``/v1/invoke``; the
body is the client's, untouched (JSON, or JSON plus binary tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from modelplex.calls import Invocation, invocation
from modelplex.wire.errors import HandlerError
from modelplex.wire.oip import (HEADER_LENGTH, PROTOCOL, PROTOCOL_HEADER, VERSION_HEADER, InferRequest, as_outputs,
                           decode_request, encode_response)


def is_oip(request: web.Request) -> bool:
    return request.headers.get(PROTOCOL_HEADER) == PROTOCOL


@dataclass
class OipInvocation(Invocation):
    """``__call__(InferRequest)``, its answer encoded as the protocol says (JSON, or JSON and
    binary tensors with the header length that :func:`finish` sets)."""

    infer: InferRequest = field(kw_only=True)
    header_length: int | None = None

    def encode(self, value: Any) -> tuple[bytes, str]:
        try:
            outputs = as_outputs(value)
            parameters = getattr(value, "parameters", None) or None
            body, self.header_length = encode_response(self.infer, outputs, parameters=parameters)
        except (TypeError, ValueError) as error:
            raise HandlerError(f"the handler's answer is not a set of tensors: {error}",
                               error_type="TypeError") from None
        return body, "application/json" if self.header_length is None else "application/octet-stream"


def oip_invocation(request: web.Request, handler: Any, body: bytes, model_id: str) -> OipInvocation:
    """The handler's call for an OIP body (400 for a malformed one)."""
    infer = decode_request(body, request.headers.get(HEADER_LENGTH))
    infer.model_name = model_id
    infer.model_version = request.headers.get(VERSION_HEADER) or None
    plain = invocation(handler, "", infer)
    return OipInvocation(plain.target, plain.args, plain.kwargs, plain.mode, name=plain.name, infer=infer)


def finish(call: Invocation, response: web.StreamResponse) -> None:
    """Add what the protocol's binary answer needs to ``response``."""
    if isinstance(call, OipInvocation) and call.header_length is not None:
        response.headers[HEADER_LENGTH] = str(call.header_length)


async def model_metadata(handler: Any, cache: Any, model_id: str) -> dict:
    """OIP model metadata from the handler's ``oip_metadata(model_id)``, if it has one; else the
    name only, after loading the model through its ``@multiplexed`` loader (so an answer
    means the model is servable)."""
    describe = getattr(handler, "oip_metadata", None)
    if describe is not None:
        return await describe(model_id)
    if cache is not None:
        await cache.get(model_id)
    return {"name": model_id, "versions": ["1"], "platform": "modelplex", "inputs": [], "outputs": []}
