"""The replica side of ``serve.run``: the handler that builds the user's deployment.

``serve.run`` ships each deployment by value (cloudpickle, as Ray does), so a class defined in a
script's ``__main__`` works and the script is never imported again in a replica (it would run
its ``serve.run`` once more). The manifest's handler is :class:`Hosted`; the replica builds it
with the deployment, and it returns the user's instance, constructed with a handle for every
deployment bound as an argument, and reconfigured with ``user_config`` as in Ray.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
from typing import Any

from modelplex.handles import handle
from modelplex.serve.graph import HandleRef

#: The file that holds one deployment's pickled (target, args, kwargs, user_config).
ENV_PAYLOAD = "MODELPLEX_SERVE_PAYLOAD"
HANDLER = "modelplex.serve.hosted:Hosted"


def _with_handles(value: Any) -> Any:
    if isinstance(value, HandleRef):
        return handle(value.deployment)
    if isinstance(value, (list, tuple)):
        return type(value)(_with_handles(item) for item in value)
    if isinstance(value, dict):
        return {key: _with_handles(item) for key, item in value.items()}
    return value


def construct(target: Any, args: tuple, kwargs: dict, user_config: Any = None) -> Any:
    """The deployment's handler: ``target(*args, **kwargs)`` for a class, the function itself else."""
    if not inspect.isclass(target):
        return target
    instance = target(*_with_handles(args), **_with_handles(kwargs))
    if user_config is not None:
        reconfigure = getattr(instance, "reconfigure", None)
        if reconfigure is None:
            raise TypeError(f"{target.__qualname__} has a user_config but no reconfigure(config) method")
        result = reconfigure(user_config)
        if inspect.isawaitable(result):
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
