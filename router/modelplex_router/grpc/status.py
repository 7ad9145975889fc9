"""The one table from the router's errors (their HTTP status) to gRPC status codes.

A gRPC client gets the JSON error's message under the code its HTTP status maps to, so a REST
and a gRPC client of the same request see the same message; ``Retry-After`` travels as the
``retry-after`` trailing metadata. The metrics count a gRPC request under that HTTP status too.
"""

from __future__ import annotations

import grpc

#: HTTP status → gRPC code, after the gRPC project's own HTTP mapping (doc/http-grpc-status-mapping.md)
#: and Triton's (an unknown model is NOT_FOUND, a malformed request INVALID_ARGUMENT).
CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def code_for(status: int) -> grpc.StatusCode:
    """The gRPC code of an HTTP status: from :data:`CODES`, else by its class."""
    code = CODES.get(status)
    if code is not None:
        return code
    if 400 <= status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.UNKNOWN if status < 500 else grpc.StatusCode.INTERNAL


def retry_metadata(retry_after: float | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries ``Retry-After`` (whole seconds, at least 1)."""
    if retry_after is None:
        return ()
    return (("retry-after", str(max(1, round(retry_after)))),)
