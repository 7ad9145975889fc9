"""The replica's side of the Open Inference Protocol: decode the router's forwarded bodies into
:class:`~modelplex.oip.InferRequest` for the handler, encode what it returns, and answer
model metadata.

The router marks an OIP request with ``X-Modelplex-Protocol: oip-v2`` on ``/v1/invoke``; the
body is the client's, untouched (JSON, or JSON plus binary tensors).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from modelplex.errors import BadRequest
from modelplex.oip import (HEADER_LENGTH, PROTOCOL, PROTOCOL_HEADER, VERSION_HEADER, InferRequest,
                           as_outputs, decode_request, encode_response)


def is_oip(request: web.Request) -> bool:
    return request.headers.get(PROTOCOL_HEADER) == PROTOCOL


def read_infer_request(request: web.Request, body: bytes, model_id: str) -> InferRequest:
    """The handler's view of an OIP body (400 for a malformed one)."""
    infer = decode_request(body, request.headers.get(HEADER_LENGTH))
    infer.model_name = model_id
    infer.model_version = request.headers.get(VERSION_HEADER) or None
    return infer


def infer_response(infer: InferRequest, result: Any) -> web.Response:
    """The OIP answer to ``infer`` from a handler's result (arrays, or an InferResponse)."""
    if isinstance(result, BaseException):
        raise result
    try:
        outputs = as_outputs(result)
    except (TypeError, ValueError) as error:
        raise BadRequest(f"the handler's answer is not a set of tensors: {error}") from None
    parameters = getattr(result, "parameters", None) or None
    body, header_length = encode_response(infer, outputs, parameters=parameters)
    if header_length is None:
        return web.Response(body=body, content_type="application/json")
    return web.Response(body=body, content_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(header_length)})


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
