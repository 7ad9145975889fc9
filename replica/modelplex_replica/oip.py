"""The replica's side of the Open Inference Protocol: decode the router's forwarded bodies into
:class:`~modelplex.wire.oip.InferRequest` for the handler, encode what it returns, and answer
model metadata.

The router marks an OIP request with ``X-Modelplex-Protocol: oip-v2`` on ``/v1/invoke`` (read by
:mod:`modelplex_replica.intake`, as :attr:`~modelplex_replica.intake.Routed.oip`); the
body is the client's, untouched (JSON, or JSON plus binary tensors). A streaming handler's chunks
go as OIP answers, one a frame, when the router asks for them with ``Accept:``
:data:`~modelplex.wire.oip.STREAM_CONTENT_TYPE` (its gRPC ``ModelStreamInfer``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from modelplex.calls import Invocation, invocation, returns_stream
from modelplex.http import to_json
from modelplex.wire.errors import BadRequest, HandlerError, ModelplexError
from modelplex.wire.oip import (HEADER_LENGTH, STREAM_CONTENT_TYPE, InferRequest, as_outputs, decode_request,
                                encode_response, stream_frame)
from modelplex_replica.intake import Routed


@dataclass
class OipInvocation(Invocation):
    """``__call__(InferRequest)``, its answer encoded as the protocol says (JSON, or JSON and
    binary tensors with the header length that :func:`finish` sets)."""

    infer: InferRequest = field(kw_only=True)
    header_length: int | None = None
    #: The router asked for a stream's chunks as OIP answers (:data:`STREAM_CONTENT_TYPE`).
    framed: bool = False

    def outcome(self, value: Any) -> tuple[bytes, str] | Invocation:
        """A one-shot infer's answer; a stream the handler returned is refused before its first
        item (an OIP client reads one answer, never NDJSON), the stream closed unread."""
        if not self.framed and returns_stream(value):
            if inspect.isgenerator(value):
                value.close()  # an async generator is closed by the loop's finalizer
            raise one_shot_stream(self.infer.model_name)
        return super().outcome(value)

    def encode(self, value: Any) -> tuple[bytes, str]:
        try:
            outputs = as_outputs(value)
            parameters = getattr(value, "parameters", None) or None
            body, self.header_length = encode_response(self.infer, outputs, parameters=parameters)
        except (TypeError, ValueError) as error:
            raise HandlerError(f"the handler's answer is not a set of tensors: {error}",
                               error_type="TypeError") from None
        return body, "application/json" if self.header_length is None else "application/octet-stream"

    def stream_content_type(self, first: Any, sse: bool) -> str:
        if not self.framed:
            return super().stream_content_type(first, sse)
        self.framing = "oip"
        return STREAM_CONTENT_TYPE

    def frame(self, chunk: Any, sse: bool) -> bytes:
        if self.framing != "oip":
            return super().frame(chunk, sse)
        body, _ = self.encode(chunk)
        return stream_frame(body, self.header_length)

    def error_frame(self, error: ModelplexError, sse: bool) -> bytes:
        if self.framing != "oip":
            return super().error_frame(error, sse)
        return stream_frame(to_json(error.to_dict()))


def oip_invocation(request: web.Request, routed: Routed, handler: Any, body: bytes, model_id: str) -> OipInvocation:
    """The handler's call for an OIP body (400 for a malformed one); ``routed.version``: the
    version the router was asked for."""
    infer = decode_request(body, request.headers.get(HEADER_LENGTH))
    infer.model_name = model_id
    infer.model_version = routed.version
    plain = invocation(handler, "", infer)
    framed = STREAM_CONTENT_TYPE in request.headers.get("Accept", "")
    if plain.streams and not framed:  # a generator handler: refused before it runs
        raise one_shot_stream(model_id)
    return OipInvocation(plain.target, plain.args, plain.kwargs, plain.mode, name=plain.name, infer=infer,
                         framed=framed)


def one_shot_stream(model_id: str | None) -> BadRequest:
    """A generator handler called through one-shot infer (REST ``/infer``, gRPC ``ModelInfer``)."""
    return BadRequest(f"model {model_id!r} streams its answers (a generator handler): one-shot infer carries "
                      "one answer; call ModelStreamInfer over gRPC, or POST /v1/models/{id}/predict for an "
                      "HTTP stream")


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
