"""The ext_proc messages the picker sends, and the header lists it reads: thin builders over
Envoy's protos (``envoy.service.ext_proc.v3``, from the ``xds-protos`` package).

Facts of Envoy's ext_proc that shape them: a processor must answer every message it is sent;
headers are set with ``append_action: OVERWRITE_IF_EXISTS_OR_ADD`` (appending would leave a
client's own value first); in ``FULL_DUPLEX_STREAMED`` every body chunk must be echoed back,
else the far side gets an empty body; dynamic metadata reaches the load balancer only in the
namespaces Envoy's ``metadata_options.receiving_namespaces`` lists (``envoy.lb``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from modelplex.wire.errors import ModelplexError
from modelplex.wire.oip import error_body

OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
#: The body mode in which the processor carries the bodies (and so must echo them).
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def header_list(headers: base_pb2.HeaderMap) -> list[tuple[str, str]]:
    """A header map as (lower-case name, value) pairs, repeats kept in order (Envoy sends the
    bytes in ``raw_value``; older versions in ``value``)."""
    return [(h.key.lower(), h.raw_value.decode("latin-1") if h.raw_value else h.value) for h in headers.headers]


def mutation(set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> ext.HeaderMutation:
    """Set (overwrite) ``set_headers`` and remove ``remove`` (names in lower case, as HTTP/2 has them)."""
    return ext.HeaderMutation(
        set_headers=[base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=name.lower(),
                                                                           raw_value=value.encode("latin-1")),
                                                append_action=OVERWRITE)
                     for name, value in set_headers.items()],
        remove_headers=list(remove),
    )


def continue_request(set_headers: Mapping[str, str], remove: Iterable[str], metadata: Mapping[str, Mapping[str, str]]
                     ) -> ext.ProcessingResponse:
    """Let the request go on with its headers changed and ``metadata`` (namespace → fields) set."""
    dynamic = struct_pb2.Struct()
    for namespace, fields in metadata.items():
        dynamic.fields[namespace].struct_value.update(dict(fields))
    return ext.ProcessingResponse(
        request_headers=ext.HeadersResponse(response=ext.CommonResponse(header_mutation=mutation(set_headers, remove))),
        dynamic_metadata=dynamic,
    )


def continue_response(remove: Iterable[str], *, read_body: bool = False, hear_end: bool = False,
                      set_headers: Mapping[str, str] | None = None) -> ext.ProcessingResponse:
    """Let the answer's headers go on, less ``remove``. Header-only, a mode override (which
    needs ``allow_mode_override`` in Envoy's filter) asks the Gateway for more of this answer:
    ``read_body``, its whole body; ``hear_end``, its trailers (empty ones where it has none),
    which tell when the answer is over with no byte of its body passing the picker."""
    answer = ext.ProcessingResponse(response_headers=ext.HeadersResponse(
        response=ext.CommonResponse(header_mutation=mutation(set_headers or {}, remove))))
    mode = processing_mode_pb2.ProcessingMode
    if read_body:
        answer.mode_override.CopyFrom(mode(response_body_mode=mode.BUFFERED, response_trailer_mode=mode.SEND))
    elif hear_end:
        answer.mode_override.CopyFrom(mode(response_trailer_mode=mode.SEND))
    return answer


def replaced(data: bytes, *, end: bool, streamed: bool) -> ext.ProcessingResponse:
    """An answer's body chunk replaced by ``data`` (``streamed``: full duplex, chunk by chunk;
    else the whole buffered body)."""
    if streamed:
        mutation_ = ext.BodyMutation(streamed_response=ext.StreamedBodyResponse(body=data, end_of_stream=end))
    else:
        mutation_ = ext.BodyMutation(body=data)
    return ext.ProcessingResponse(response_body=ext.BodyResponse(response=ext.CommonResponse(body_mutation=mutation_)))


def body(chunk: ext.HttpBody, *, response: bool, echo: bool) -> ext.ProcessingResponse:
    """The answer to a body chunk: the chunk echoed byte for byte (``echo``: full-duplex
    streaming, where the processor sends the body on), else "go on" (the chunk passes as it is)."""
    if echo:
        common = ext.CommonResponse(body_mutation=ext.BodyMutation(
            streamed_response=ext.StreamedBodyResponse(body=chunk.body, end_of_stream=chunk.end_of_stream)))
    else:
        common = ext.CommonResponse()
    answer = ext.BodyResponse(response=common)
    return ext.ProcessingResponse(response_body=answer) if response else ext.ProcessingResponse(request_body=answer)


def trailers(*, response: bool) -> ext.ProcessingResponse:
    """Trailers go on as they are."""
    if response:
        return ext.ProcessingResponse(response_trailers=ext.TrailersResponse())
    return ext.ProcessingResponse(request_trailers=ext.TrailersResponse())


def immediate(status: int, document: object, headers: Mapping[str, str] | None = None) -> ext.ProcessingResponse:
    """Answer the client now with ``status`` and ``document`` as JSON (None: no body); the
    request goes nowhere."""
    sent = {**({"content-type": "application/json"} if document is not None else {}), **(headers or {})}
    return ext.ProcessingResponse(immediate_response=ext.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), headers=mutation(sent),
        body=orjson.dumps(document) if document is not None else b"", details="modelplex_endpoint_picker"))


def refusal(error: ModelplexError, *, oip: bool, headers: Mapping[str, str] | None = None
            ) -> ext.ProcessingResponse:
    """``error`` as the router answers it: its status, its JSON (the OIP's ``{"error": "..."}``
    under ``/v2``) and its ``Retry-After`` (and ``headers``: CORS ones)."""
    document = orjson.loads(error_body(error.message)) if oip else error.to_dict()
    return immediate(error.status, document, {**error.response_headers(), **(headers or {})})
