"""``@serve.ingress(app)``: a FastAPI or Starlette app as a deployment's HTTP API, as in Ray Serve.

    fastapi_app = FastAPI()

    @serve.deployment
    @serve.ingress(fastapi_app)
    class Orchestrator:
        @fastapi_app.post("/detect")
        async def run(self, video_url: str) -> str: ...

The replica serves the app (ASGI, :mod:`modelplex_replica.asgi`) for every HTTP request on the
deployment's route prefix, whatever its method and sub-path; handles still call the class's
methods by name. A FastAPI route that is a method of the class gets the deployment's instance
as ``self`` (a dependency, as Ray's class-based views do). Needs the ``ingress`` extra
(``pip install 'modelplex[ingress]'``) only where FastAPI is used; any ASGI app works.
"""

from __future__ import annotations

import functools
import inspect
from contextvars import ContextVar
from typing import Any, Callable

#: The class attribute that holds a deployment's ASGI app.
ASGI_ATTR = "__modelplex_asgi_app__"

#: The deployment instance serving the current request (set by the replica for each request).
current_instance: ContextVar[Any] = ContextVar("modelplex_serve_instance")


def ingress(app: Any) -> Callable[[type], type]:
    """Serve ``app`` (a FastAPI or Starlette app, or any ASGI callable) as the decorated class's
    HTTP API. Put it below ``@serve.deployment``."""
    if not callable(app):
        raise TypeError(f"serve.ingress takes an ASGI app such as FastAPI() (got {type(app).__name__})")

    def decorate(cls: type) -> type:
        if not inspect.isclass(cls):
            kind = "a deployment" if hasattr(cls, "func_or_class") else type(cls).__name__
            raise TypeError(f"@serve.ingress decorates a class, not {kind}: put it below @serve.deployment")
        if _is_fastapi(app):
            _methods_as_routes(app, cls)
        setattr(cls, ASGI_ATTR, app)
        if not any("__call__" in vars(klass) for klass in cls.__mro__ if klass is not object):
            setattr(cls, "__call__", _http_only)  # handles call the class's methods by name
        return cls

    return decorate


def asgi_app(handler: Any) -> Any:
    """The ASGI app ``@serve.ingress`` gave ``handler``'s class, else None."""
    return getattr(type(handler), ASGI_ATTR, None)


def _http_only(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(f"{type(self).__qualname__} is a serve.ingress deployment: its app answers HTTP; "
                    "call its methods by name through a handle (handle.method.remote(...))")


def _instance() -> Any:
    """The FastAPI dependency that gives a class-based route its ``self``."""
    try:
        return current_instance.get()
    except LookupError:
        raise RuntimeError("this route is a deployment's method: it runs only in the deployment's replica") from None


def _is_fastapi(app: Any) -> bool:
    try:
        from fastapi import FastAPI
    except ImportError:
        return False
    return isinstance(app, FastAPI)


def _methods_as_routes(app: Any, cls: type) -> None:
    """Rebuild each route whose endpoint is a method of ``cls`` so that FastAPI fills ``self``
    with the serving instance (a dependency) instead of reading it from the query string."""
    from fastapi.routing import APIRoute

    methods = {function for function in vars(cls).values() if inspect.isfunction(function)}
    routes = app.router.routes
    init = inspect.signature(APIRoute.__init__).parameters
    for index, route in enumerate(routes):
        if not isinstance(route, APIRoute) or route.endpoint not in methods:
            continue
        settings = {name: getattr(route, name) for name in init
                    if name not in ("self", "path", "endpoint") and hasattr(route, name)}
        routes[index] = APIRoute(route.path, _bound_endpoint(route.endpoint), **settings)
    mark_changed = getattr(app.router, "_mark_routes_changed", None)
    if callable(mark_changed):
        mark_changed()
    app.openapi_schema = None


def _bound_endpoint(method: Callable) -> Callable:
    """``method`` as an endpoint whose ``self`` is the ``_instance`` dependency. Its other
    parameters become keyword-only (``self`` now has a default), as FastAPI passes them."""
    from fastapi import Depends

    try:  # resolved here: FastAPI would resolve string annotations in this module's globals
        signature = inspect.signature(method, eval_str=True)
    except (NameError, SyntaxError, TypeError):
        signature = inspect.signature(method)
    first, *rest = signature.parameters.values()
    parameters = [first.replace(default=Depends(_instance), annotation=inspect.Parameter.empty)]
    parameters += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) else p for p in rest]

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def endpoint(**kwargs: Any) -> Any:
            return await method(**kwargs)
    else:  # FastAPI runs a plain def in its thread pool, as it would the method
        @functools.wraps(method)
        def endpoint(**kwargs: Any) -> Any:
            return method(**kwargs)
    setattr(endpoint, "__signature__", signature.replace(parameters=parameters))
    return endpoint
