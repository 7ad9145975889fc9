"""One error tree for every HTTP surface; :mod:`modelplex.http` maps it to JSON responses.

Each error carries its HTTP status and a stable ``code`` so clients can branch on it:
``{"error": {"code": "model_not_found", "message": "..."}}``.
"""

from __future__ import annotations

import builtins
import functools
import sys
import traceback
from typing import Any, Iterable


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

    def __init__(self, message: str, *, error_type: str | None = None, error_module: str | None = None):
        super().__init__(message)
        self.error_type = error_type
        #: The module that defines ``error_type`` (None: a built-in), so a caller whose code
        #: defines the same class re-raises it as that class (:func:`remote_error_class`).
        self.error_module = error_module

    @classmethod
    def of(cls, error: BaseException, *, with_traceback: bool = False) -> HandlerError:
        """The error to answer for an exception the user's code raised; ``with_traceback``
        (a handle's call, as Ray's errors carry it) adds where it was raised to the message."""
        kind = type(error)
        message = f"{kind.__name__}: {error}"
        frames = _user_frames(error.__traceback__) if with_traceback else None
        if frames:
            message += "\n\nTraceback in the deployment (most recent call last):\n" + "".join(
                traceback.format_list(frames)).rstrip()
        module = kind.__module__ if kind.__module__ != "builtins" else None
        return cls(message, error_type=kind.__name__, error_module=module)

    def to_dict(self) -> dict[str, dict[str, str]]:
        document = super().to_dict()
        if self.error_type:
            document["error"]["type"] = self.error_type
        if self.error_module:
            document["error"]["module"] = self.error_module
        return document


def _user_frames(tb: Any) -> traceback.StackSummary | None:
    """The frames of ``tb`` from the first that is not Modelplex's own (how the replica called
    the user's code is no part of the user's error)."""
    while tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith(("modelplex.", "modelplex_")):
        tb = tb.tb_next
    return traceback.extract_tb(tb) if tb is not None else None


class EmptyModelId(BadRequest, ValueError):
    """A ``@multiplexed`` loader called without a model id: Ray's ``ValueError`` and message (over
    HTTP, a 400 whose error names the type, and a hint saying where the id goes)."""

    #: Over HTTP, where a client puts the id (Ray's message alone does not say).
    HINT = ("send the model id in the serve_multiplexed_model_id header (or the model's path, "
            "/v1/models/{id}/predict); through a handle, .options(multiplexed_model_id=...)")

    def __init__(self, message: str = "The model ID cannot be empty."):
        super().__init__(message)

    def to_dict(self) -> dict[str, dict[str, str]]:
        document = super().to_dict()
        document["error"]["type"] = ValueError.__name__
        document["error"]["hint"] = self.HINT
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


class RayServeException(Exception):
    """Ray Serve's own base exception (``ray.serve.exceptions.RayServeException``): the errors
    below are also Modelplex's, so either ``except`` catches them."""


class BatchSizeMismatch(HandlerError, RayServeException):
    """A batched function answered a batch with a different number of results: Ray's
    ``RayServeException`` and message."""

    def __init__(self, inputs: int, results: int):
        super().__init__(f"Batched function doesn't preserve batch size. The input list has length {inputs} "
                         f"but the returned list has length {results}.", error_type=RayServeException.__name__)


class BackPressureError(Overloaded, RayServeException):
    """A handle's call refused because the deployment's queue is full (a 503 over HTTP), as Ray
    raises it (``max_queued_requests``)."""

    def __init__(self, message: str | None = None, *, num_queued_requests: int | None = None,
                 max_queued_requests: int | None = None, retry_after: float = 1.0):
        super().__init__(message or f"Request dropped due to backpressure (num_queued_requests={num_queued_requests}, "
                                    f"max_queued_requests={max_queued_requests}).", retry_after=retry_after)


class DeploymentUnavailableError(NotReady, RayServeException):
    """A handle's call to a deployment with no replica ready (none became ready in time), as Ray
    raises it for a deployment that is unavailable."""


class RequestCancelledError(RayServeException):
    """Awaiting a handle's response that was cancelled (``response.cancel()``), as in Ray."""

    def __init__(self, request_id: str | None = None):
        super().__init__(f"Request {request_id} was cancelled." if request_id else "The request was cancelled.")


#: What a handle raises for these answers: Ray's exception, which is also Modelplex's.
_RAISED_AS: dict[type[ModelplexError], type[ModelplexError]] = {
    Overloaded: BackPressureError, NotReady: DeploymentUnavailableError}
#: Ray's exception types a remote answer may name (``error.type``), beside the built-in ones.
_RAY_TYPES: dict[str, type[Exception]] = {RayServeException.__name__: RayServeException}

_CLASSES: list[type[ModelplexError]] = [BadRequest, ModelNotFound, NotFound, PayloadTooLarge, Overloaded, NotReady,
                                        ModelLoadError, ModelLoadTimeout, ModelTooLarge, HandlerError, ReplicaFailed,
                                        UpstreamTimeout, Unauthorized, Forbidden, RequestTimeout, ModelNotLoaded,
                                        LoadQuotaExceeded]


def error_for_status(status: int, message: str, code: str | None = None,
                     error_type: str | None = None, error_module: str | None = None) -> ModelplexError:
    """The error a remote answer stands for (a handle re-raises what a deployment answered).

    Matched by ``code``; by status only where one class has that status, so an unknown 500 stays
    a plain :class:`ModelplexError` with its status and code. A ``handler_error`` with the
    user's exception type raises as :func:`remote_error_class` of it; a ``bad_request`` that
    names a built-in type (Ray's ``ValueError`` for an empty model id) is that type too.
    """
    if code == HandlerError.code and error_type:
        return _instance(remote_error_class(error_type, error_module), message, error_type, error_module)
    if code == BadRequest.code and error_type == ValueError.__name__:
        return EmptyModelId(message)
    match = next((cls for cls in _CLASSES if cls.code == code), None)
    if match is None:
        same_status = [cls for cls in _CLASSES if cls.status == status]
        match = same_status[0] if len(same_status) == 1 else None
    if match is None:
        error = ModelplexError(message)
        error.status = status
        error.code = code or error.code
        return error
    return _RAISED_AS.get(match, match)(message)


def remote_error_class(type_name: str, module: str | None = None) -> type[HandlerError]:
    """A :class:`HandlerError` named after the user's exception type.

    For a built-in exception (or Ray's ``RayServeException``) it is also that exception
    (``except ZeroDivisionError`` catches it, as with Ray's ``RayTaskError``); so is it for a
    class of the caller's own code: ``module`` and the name are looked up among the modules this
    process has imported (the deployment's code is the caller's code too; nothing is unpickled).
    Any other type keeps its name only (``error_type`` holds it), as Ray's wrapper does.
    """
    own = _imported_class(type_name, module) if module else None
    if own is not None:
        return _remote_class(type_name, own, module)
    builtin = _RAY_TYPES.get(type_name) or getattr(builtins, type_name, None)
    return _remote_class(type_name, builtin if isinstance(builtin, type) else None, __name__)


@functools.lru_cache(maxsize=256)
def _remote_class(type_name: str, base: type | None, module: str | None) -> type[HandlerError]:
    if base is not None and issubclass(base, Exception) and not issubclass(base, HandlerError):
        try:
            return type(type_name, (HandlerError, base), {"__module__": module or __name__})
        except TypeError:  # a built-in with its own instance layout (OSError, ...)
            pass
    if not type_name.isidentifier():
        return HandlerError
    return type(type_name, (HandlerError,), {"__module__": __name__})


#: Exception classes this process has by value (a deployment shipped by cloudpickle: its module
#: is not imported here), by (module, qualified name).
_known: dict[tuple[str, str], type] = {}


def remember_exception_classes(values: Iterable[Any]) -> None:
    """Remember the exception classes among ``values`` (a deployment's globals), so an error of
    one of those classes raised downstream is re-raised here as that class."""
    for value in values:
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ != "builtins":
            _known[(value.__module__, value.__name__)] = value


def _imported_class(name: str, module: str) -> type | None:
    """The exception class ``module.name`` where this process has it: remembered, or at the top
    of a module it has imported (a class nested in a function is matched by neither: its name only)."""
    if (module, name) in _known:
        return _known[(module, name)]
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def _instance(cls: type[HandlerError], message: str, error_type: str, error_module: str | None) -> HandlerError:
    """``cls(message)``; a user's class whose constructor takes other arguments is built
    without calling it (its attributes but the message are not known here)."""
    try:
        return cls(message, error_type=error_type, error_module=error_module)
    except TypeError:
        error = cls.__new__(cls)
        Exception.__init__(error, message)
        error.message, error.retry_after = message, None
        error.error_type, error.error_module = error_type, error_module
        return error
