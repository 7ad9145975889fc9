"""Build the user's handler for a deployment, with the spec's overrides in force.

    with runtime_scope(runtime_for(deployment)):
        handler = build_handler(deployment)
        ... serve it ...
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from modelplex.runtime import Runtime
from modelplex.spec import Deployment, SpecError
from modelplex_replica.sizes import configure_cache


def runtime_for(deployment: Deployment) -> Runtime:
    """What the SDK reads in this replica: spec values override decorator arguments (DESIGN.md)."""
    spec = deployment.spec
    runtime = Runtime(
        max_models_per_replica=spec.multiplexing.max_models_per_replica,
        max_batch_size=spec.batching.max_batch_size,
        batch_wait_timeout_s=spec.batch_wait_timeout_s,
    )
    configure_cache(spec, runtime)
    return runtime


def build_handler(deployment: Deployment) -> Any:
    """An instance of ``spec.handler`` (or the built-in TorchScript handler), built inside the
    replica's :func:`~modelplex.runtime.runtime_scope`.

    The manifest's folder is on the import path, so ``handler: "probe:Model"`` finds
    ``probe.py`` beside the manifest. A handler class may take a ``deployment`` argument.
    """
    spec = deployment.spec
    if spec.handler is None:
        from modelplex_replica.builtin import TorchScriptHandler

        return TorchScriptHandler(spec.model_source.uri, base_dir=deployment.base_dir)
    if deployment.base_dir is not None and str(deployment.base_dir) not in sys.path:
        sys.path.insert(0, str(deployment.base_dir))
    module_name, _, class_name = spec.handler.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SpecError([f"spec.handler: cannot import {module_name!r}: {error}"]) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise SpecError([f"spec.handler: {module_name!r} has no {class_name!r}"])
    if not callable(cls):
        raise SpecError([f"spec.handler: {spec.handler!r} is not callable"])
    if inspect.isclass(cls) and "deployment" in inspect.signature(cls).parameters:
        return cls(deployment=deployment)
    return cls() if inspect.isclass(cls) else cls
