"""One error tree for every HTTP surface; :mod:`modelplex.http` maps it to JSON responses.

Each error carries its HTTP status and a stable ``code`` so clients can branch on it:
``{"error": {"code": "model_not_found", "message": "..."}}``.
"""

from __future__ import annotations

import builtins
import functools
from typing import Any


def error_document(code: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON error every HTTP surface answers with: ``{"error": {"code", "message"}}``."""
    return {"error": {"code": code, "message": message}}


def error_object(document: Any) -> dict[str, Any] | None:
    """The ``error`` object of a parsed JSON error (:func:`error_document`), else None."""
    error = document.get("error") if isinstance(document, dict) else None
    return error if isinstance(error, dict) else None


class ModelplexError(Exception):
    """Base of every error that reaches a client."""

    status = 500
    code = "internal"

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kwargs: Any) -> None:
        # A class states its answer in its header line: ``class NotFound(ModelplexError,
        # status=404, code="not_found")``; one without them inherits its parent's.
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.message  # not KeyError's quoted repr when a remote error is also a KeyError

    def to_dict(self) -> dict[str, dict[str, str]]:
        return error_document(self.code, self.message)

    def response_headers(self) -> dict[str, str]:
        """Headers the answer carries beside the JSON body."""
        return {"Retry-After": str(max(1, round(self.retry_after)))} if self.retry_after is not None else {}


class BadRequest(ModelplexError, status=400, code="bad_request"):
    """The request cannot be served as sent (a malformed body, a missing or impossible field)."""


class BatchItemTooLarge(BadRequest, RuntimeError):
    """A request larger, by the ``batch_size_fn``, than a whole batch (a ``RuntimeError``, as in Ray)."""


class ModelNotFound(ModelplexError, status=404, code="model_not_found"):
    """The model id names no model the deployment can load."""


class NotFound(ModelplexError, status=404, code="not_found"):
    """No route, method or resource by that name."""


class PayloadTooLarge(ModelplexError, status=413, code="payload_too_large"):
    """The body is over the configured limit."""


class RequestTimeout(ModelplexError, status=408, code="request_timeout"):
    """The request's body did not arrive within ``spec.router.bodyTimeoutSeconds``."""


class Overloaded(ModelplexError, status=503, code="overloaded"):
    """Every slot is taken; the client should retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0):
        super().__init__(message, retry_after=retry_after)


class NotReady(ModelplexError, status=503, code="not_ready"):
    """No replica is ready to serve (none became ready in time, or all are starting or draining)."""


class ModelNotLoaded(ModelplexError, status=503, code="model_not_loaded"):
    """No ready replica holds the model and the request said not to wait for a load
    (``onCold: reject``); a load started in the background, so a retry may find it."""

    def __init__(self, message: str, *, retry_after: float = 1.0):
        super().__init__(message, retry_after=retry_after)


class LoadQuotaExceeded(ModelplexError, status=429, code="load_quota_exceeded"):
    """The client spent its cold loads (``spec.router.loadQuota``); no load was started."""

    def __init__(self, message: str, *, retry_after: float = 1.0):
        super().__init__(message, retry_after=retry_after)


class ModelLoadError(ModelplexError, status=500, code="model_load_failed"):
    """Loading a model failed; not cached, so the next request tries again."""


class ModelLoadTimeout(ModelplexError, status=504, code="model_load_timeout"):
    """A load ran past ``loadTimeoutSeconds``; not cached, so the next request tries again."""


class ModelTooLarge(ModelplexError, status=507, code="model_too_large"):
    """A model measured larger than the replica's whole cache budget: it can never be held."""


class HandlerError(ModelplexError, status=500, code="handler_error"):
    """The user's code raised; ``error_type`` names the exception's class (``"ValueError"``)."""

    def __init__(self, message: str, *, error_type: str | None = None):
        super().__init__(message)
        self.error_type = error_type

    @classmethod
    def of(cls, error: BaseException) -> HandlerError:
        """The error to answer for an exception the user's code raised."""
        return cls(f"{type(error).__name__}: {error}", error_type=type(error).__name__)

    def to_dict(self) -> dict[str, dict[str, str]]:
        document = super().to_dict()
        if self.error_type:
            document["error"]["type"] = self.error_type
        return document


class ReplicaFailed(ModelplexError, status=502, code="replica_failed"):
    """A replica failed to answer: its connection broke, or its answer or stream was not valid."""


class UpstreamTimeout(ModelplexError, status=504, code="timeout"):
    """The replica did not answer within the router's request timeout."""


class Unauthorized(ModelplexError, status=401, code="unauthorized"):
    """No credential, or a wrong one: the answer carries ``WWW-Authenticate: Bearer``."""

    def response_headers(self) -> dict[str, str]:
        return {**super().response_headers(), "WWW-Authenticate": 'Bearer realm="modelplex"'}


class Forbidden(ModelplexError, status=403, code="forbidden"):
    """A known caller that may not do this, or a feature that is off."""


_CLASSES: list[type[ModelplexError]] = [BadRequest, ModelNotFound, NotFound, PayloadTooLarge, Overloaded, NotReady,
                                        ModelLoadError, ModelLoadTimeout, ModelTooLarge, HandlerError, ReplicaFailed,
                                        UpstreamTimeout, Unauthorized, Forbidden, RequestTimeout, ModelNotLoaded,
                                        LoadQuotaExceeded]


def error_for_status(status: int, message: str, code: str | None = None,
                     error_type: str | None = None) -> ModelplexError:
    """The error a remote answer stands for (a handle re-raises what a deployment answered).

    Matched by ``code``; by status only where one class has that status, so an unknown 500 stays
    a plain :class:`ModelplexError` with its status and code. A ``handler_error`` with the
    user's exception type raises as :func:`remote_error_class` of it.
    """
    if code == HandlerError.code and error_type:
        return remote_error_class(error_type)(message, error_type=error_type)
    match = next((cls for cls in _CLASSES if cls.code == code), None)
    if match is None:
        same_status = [cls for cls in _CLASSES if cls.status == status]
        match = same_status[0] if len(same_status) == 1 else None
    if match is None:
        error = ModelplexError(message)
        error.status = status
        error.code = code or error.code
        return error
    return match(message)


@functools.lru_cache(maxsize=256)
def remote_error_class(type_name: str) -> type[HandlerError]:
    """A :class:`HandlerError` named after the user's exception type.

    For a built-in exception it is also that exception (``except ZeroDivisionError`` catches
    it, as with Ray's ``RayTaskError``); other types cannot be rebuilt here, so they keep their
    name only (``error_type`` holds it).
    """
    builtin = getattr(builtins, type_name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception) and not issubclass(builtin, HandlerError):
        try:
            return type(type_name, (HandlerError, builtin), {"__module__": __name__})
        except TypeError:  # a built-in with its own instance layout (OSError, ...)
            pass
    if not type_name.isidentifier():
        return HandlerError
    return type(type_name, (HandlerError,), {"__module__": __name__})
