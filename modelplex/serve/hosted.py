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
import socket
import sys
from typing import Any, Callable, Coroutine

from modelplex.context import ReplicaContext, set_replica_context
from modelplex.handles import handle
from modelplex.serve.graph import DEFAULT_APPLICATION, ENV_APPLICATION, ENV_DEPLOYMENT, HandleRef, scoped
from modelplex.wire.errors import remember_exception_classes
from modelplex.wire.names import ENV_POD_NAME

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


def _referenced(target: Any) -> list[Any]:
    """What ``target``'s code refers to by global name: a class's methods' globals, a function's
    (shipped by value, they hold the exception classes its ``except`` clauses name)."""
    functions = [member for _, member in inspect.getmembers(target, inspect.isfunction)] \
        if inspect.isclass(target) else [target]
    return [value for function in functions for value in getattr(function, "__globals__", {}).values()]


def replica_context(name: str) -> ReplicaContext:
    """This replica's context, from what its manifest put in its environment (``name``: its
    deployment's object name, where the manifest is not one ``serve.run`` or ``modelplex build`` wrote)."""
    deployment = os.environ.get(ENV_DEPLOYMENT) or name
    unique = os.environ.get(ENV_POD_NAME) or f"{socket.gethostname()}-{os.getpid()}"
    return ReplicaContext(app_name=os.environ.get(ENV_APPLICATION) or DEFAULT_APPLICATION, deployment=deployment,
                          replica_tag=f"{deployment}#{unique}")


def construct(target: Any, args: tuple, kwargs: dict, user_config: Any = None, app_name: str | None = None,
              context: ReplicaContext | None = None) -> Any:
    """The deployment's handler: ``target(*args, **kwargs)`` for a class, the function itself
    else; its bound deployments are handles to those of the application ``app_name``.
    ``context`` is ``serve.get_replica_context()`` from the constructor on, the instance its
    ``servable_object`` once built."""
    if context is not None:
        set_replica_context(context)
    remember_exception_classes(_referenced(target))
    if not inspect.isclass(target):
        if context is not None:
            context.servable_object = target
        return target
    instance = target(*_with_handles(args, app_name), **_with_handles(kwargs, app_name))
    if context is not None:
        context.servable_object = instance
    if user_config is not None:
        reconfigure_at_start(instance, user_config)
    return instance


def _reconfigure_method(instance: Any) -> Callable[[Any], Any]:
    reconfigure = getattr(instance, "reconfigure", None)
    if not callable(reconfigure):
        raise TypeError(f"{type(instance).__qualname__} has a user_config but no reconfigure(config) method")
    return reconfigure


def reconfigure_at_start(instance: Any, user_config: Any) -> None:
    """``instance.reconfigure(user_config)`` as the replica builds it, before any loop runs
    (an async one runs to its end); a TypeError where it has no ``reconfigure``."""
    result = _reconfigure_method(instance)(user_config)
    if inspect.iscoroutine(result):  # an async reconfigure (asyncio.run takes only a coroutine)
        asyncio.run(result)


async def reconfigure(instance: Any, user_config: Any) -> None:
    """``instance.reconfigure(user_config)`` on a live replica, on the user-code loop: a new
    ``user_config`` from ``serve.run`` (:func:`follow_user_config`) or from the operator
    (``POST /v1/user-config``, :mod:`modelplex.wire.user_config`)."""
    result = _reconfigure_method(instance)(user_config)
    if inspect.isawaitable(result):
        await result


class Hosted:
    """Builds the deployment whose payload ``$MODELPLEX_SERVE_PAYLOAD`` names (the replica passes
    ``deployment``; what it gets back is the user's instance, not a ``Hosted``). The instance
    then follows its payload's ``user_config`` (:func:`follow_user_config`)."""

    def __new__(cls, deployment: Any) -> Any:
        path = os.environ.get(ENV_PAYLOAD)
        if not path:
            raise RuntimeError(f"{deployment.name}: {ENV_PAYLOAD} is not set; this handler is started by serve.run")
        stamp = os.stat(path).st_mtime_ns
        with open(path, "rb") as file:
            target, args, kwargs, user_config = pickle.load(file)  # cloudpickle's output is plain pickle
        instance = construct(target, args, kwargs, user_config, context=replica_context(deployment.name))
        if callable(getattr(instance, "reconfigure", None)):
            _followers.append(lambda: follow_user_config(path, instance, user_config, stamp))
        return instance


#: Suffix of the file a replica writes once it reconfigured from a payload (its content: the
#: payload's modification time in ns); ``serve.run`` waits for one per live replica.
APPLIED_SUFFIX = ".applied-"
#: How often a replica looks whether ``serve.run`` gave its deployment a new ``user_config``.
PAYLOAD_POLL_S = 0.2
#: What the replica runs beside its handler on the user-code loop (:func:`background_tasks`).
_followers: list[Callable[[], Coroutine[Any, Any, None]]] = []


def background_tasks() -> list[Callable[[], Coroutine[Any, Any, None]]]:
    """The coroutines the replica runs on its user-code loop for the deployments built here."""
    return list(_followers)


async def follow_user_config(path: str, instance: Any, user_config: Any, stamp: int) -> None:
    """Call ``instance.reconfigure`` with the payload's new ``user_config`` whenever ``serve.run``
    replaces the payload (Ray reconfigures live replicas; nothing restarts), on the user-code
    loop between requests, then say so beside the payload."""
    while True:
        await asyncio.sleep(PAYLOAD_POLL_S)
        try:
            now = os.stat(path).st_mtime_ns
            if now == stamp:
                continue
            with open(path, "rb") as file:
                *_, new_config = pickle.load(file)
        except (OSError, EOFError, pickle.UnpicklingError):
            continue  # being replaced: the next look sees it whole
        stamp = now
        if new_config != user_config:
            await reconfigure(instance, new_config)
            user_config = new_config
        done = f"{path}{APPLIED_SUFFIX}{os.getpid()}"
        with open(done + ".new", "w") as file:
            file.write(str(now))
        os.replace(done + ".new", done)


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
        # The manifest's spec.userConfig, where it has one, is the replica's to apply (it may
        # change on the live replica); the application's own user_config only where it has none.
        user_config = node.options.user_config if deployment.spec.user_config is None else None
        return construct(node.target, node.args, node.kwargs, user_config, app_name,
                         context=replica_context(node.options.name))
