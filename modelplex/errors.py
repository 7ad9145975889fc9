"""One error tree for every HTTP surface; :mod:`modelplex.http` maps it to JSON responses.

Each error carries its HTTP status and a stable ``code`` so clients can branch on it:
``{"error": {"code": "model_not_found", "message": "..."}}``.
"""

from __future__ import annotations


class ModelplexError(Exception):
    """Base of every error that reaches a client."""

    status = 500
    code = "internal"

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def to_dict(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


class BadRequest(ModelplexError):
    status = 400
    code = "bad_request"


class ModelNotFound(ModelplexError):
    status = 404
    code = "model_not_found"


class NotFound(ModelplexError):
    status = 404
    code = "not_found"


class PayloadTooLarge(ModelplexError):
    status = 413
    code = "payload_too_large"


class Overloaded(ModelplexError):
    """Every slot is taken; the client should retry after ``retry_after`` seconds."""

    status = 503
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0):
        super().__init__(message, retry_after=retry_after)


class NotReady(ModelplexError):
    status = 503
    code = "not_ready"


class ModelLoadError(ModelplexError):
    """Loading a model failed; not cached, so the next request tries again."""

    status = 500
    code = "model_load_failed"


class HandlerError(ModelplexError):
    """The user's handler raised."""

    status = 500
    code = "handler_error"


class ReplicaFailed(ModelplexError):
    status = 502
    code = "replica_failed"


class UpstreamTimeout(ModelplexError):
    status = 504
    code = "timeout"


def error_for_status(status: int, message: str, code: str | None = None) -> ModelplexError:
    """The error a remote answer stands for (a handle re-raises what a deployment answered)."""
    classes = [BadRequest, ModelNotFound, NotFound, PayloadTooLarge, Overloaded, NotReady, ModelLoadError,
               HandlerError, ReplicaFailed, UpstreamTimeout]
    match = next((cls for cls in classes if cls.code == code), None)
    match = match or next((cls for cls in classes if cls.status == status), None)
    if match is None:
        error = ModelplexError(message)
        error.status = status
        return error
    return match(message)
