"""The replica side of ``serve.run``: the handler that builds the user's deployment.

``serve.run`` ships each deployment by value (cloudpickle, as Ray does), so a class defined in a
script's ``__main__`` works and the script is never imported again in a replica (it would run
its ``serve.run`` once more). The manifest's handler is :class:`Hosted`; the replica builds it
with the deployment, and it returns the user's instance, constructed with a handle for every
deployment bound as an argument, and reconfigured with ``user_config`` as in Ray.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import pickle
import sys
from typing import Any

from modelplex.handles import handle
from modelplex.serve.graph import HandleRef, scoped

#: The file that holds one deployment's pickled (target, args, kwargs, user_config).
ENV_PAYLOAD = "MODELPLEX_SERVE_PAYLOAD"
HANDLER = "modelplex.serve.hosted:Hosted"
#: ``module:attribute`` of the application a built deployment belongs to (``modelplex build``).
ENV_APP = "MODELPLEX_SERVE_APP"
#: Where that module is, when it is not on the import path (``modelplex local app.py:app``).
ENV_APP_DIR = "MODELPLEX_SERVE_APP_DIR"
APP_HANDLER = "modelplex.serve.hosted:FromApp"
#: The application's name, where ``modelplex build --name`` scoped its deployments' names by it.
ENV_APP_NAME = "MODELPLEX_SERVE_APP_NAME"


def _with_handles(value: Any, app_name: str | None = None) -> Any:
    if isinstance(value, HandleRef):
        return handle(scoped(app_name, value.deployment))
    if isinstance(value, (list, tuple)):
        return type(value)(_with_handles(item, app_name) for item in value)
    if isinstance(value, dict):
        return {key: _with_handles(item, app_name) for key, item in value.items()}
    return value


def construct(target: Any, args: tuple, kwargs: dict, user_config: Any = None, app_name: str | None = None) -> Any:
    """The deployment's handler: ``target(*args, **kwargs)`` for a class, the function itself
    else; its bound deployments are handles to those of the application ``app_name``."""
    if not inspect.isclass(target):
        return target
    instance = target(*_with_handles(args, app_name), **_with_handles(kwargs, app_name))
    if user_config is not None:
        reconfigure = getattr(instance, "reconfigure", None)
        if reconfigure is None:
            raise TypeError(f"{target.__qualname__} has a user_config but no reconfigure(config) method")
        result = reconfigure(user_config)
        if inspect.iscoroutine(result):  # an async reconfigure (asyncio.run takes only a coroutine)
            asyncio.run(result)
    return instance


class Hosted:
    """Builds the deployment whose payload ``$MODELPLEX_SERVE_PAYLOAD`` names (the replica passes
    ``deployment``; what it gets back is the user's instance, not a ``Hosted``)."""

    def __new__(cls, deployment: Any) -> Any:
        path = os.environ.get(ENV_PAYLOAD)
        if not path:
            raise RuntimeError(f"{deployment.name}: {ENV_PAYLOAD} is not set; this handler is started by serve.run")
        with open(path, "rb") as file:
            target, args, kwargs, user_config = pickle.load(file)  # cloudpickle's output is plain pickle
        return construct(target, args, kwargs, user_config)


def import_app(target: str) -> Any:
    """The application ``module:attribute`` names (importing the module, as Ray's ``serve run`` does)."""
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise LookupError(f"cannot import {module_name!r}: {error}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise LookupError(f"{module_name!r} has no {attribute!r}") from None


class FromApp:
    """Builds this replica's deployment from the application ``$MODELPLEX_SERVE_APP`` names: the
    module is imported (it must not call ``serve.run``), its graph walked as ``modelplex build``
    walked it, and the node named like the deployment constructed."""

    def __new__(cls, deployment: Any) -> Any:
        from modelplex.serve.graph import walk

        target = os.environ.get(ENV_APP)
        if not target:
            raise RuntimeError(f"{deployment.name}: {ENV_APP} is not set; this handler is written by modelplex build")
        folder = os.environ.get(ENV_APP_DIR)
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
        app_name = os.environ.get(ENV_APP_NAME) or None
        nodes = {scoped(app_name, node.name): node for node in walk(import_app(target))}
        node = nodes.get(deployment.name)
        if node is None:
            raise LookupError(f"{target} has no deployment {deployment.name!r}; it has {', '.join(nodes)}")
        return construct(node.target, node.args, node.kwargs, node.options.user_config, app_name)
