"""Build the user's handler for a deployment, with the spec's overrides in force.

    with runtime_scope(runtime_for(deployment)):
        handler = build_handler(deployment)
        ... serve it ...
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from typing import Any

from modelplex.runtime import Runtime
from modelplex.serve.hosted import reconfigure_at_start
from modelplex.wire.names import ENV_SOURCE_URI
from modelplex.wire.spec import Deployment, DeploymentSpec, SpecError
from modelplex_replica.sizes import ModelSizer, device, device_memory_bytes, give_freed_weights_back
from modelplex_replica.warm import HostTier

log = logging.getLogger("modelplex.replica")


def runtime_for(deployment: Deployment) -> Runtime:
    """What the SDK reads in this replica: spec values override decorator arguments (DESIGN.md)."""
    spec = deployment.spec
    runtime = Runtime(
        max_models_per_replica=spec.multiplexing.max_models_per_replica,
        max_ongoing_requests=spec.max_ongoing_requests,
        max_batch_size=spec.batching.max_batch_size,
        batch_wait_timeout_s=spec.batch_wait_timeout_s,
    )
    configure_cache(spec, runtime)
    return runtime


def configure_cache(spec: DeploymentSpec, runtime: Runtime) -> None:
    """Fill in the cache's limits, its size measurement and its warm tier in the replica's
    ``runtime`` (before the handler's caches are built)."""
    give_freed_weights_back()
    multiplexing = spec.multiplexing
    where = device()
    budget = multiplexing.max_model_bytes
    if multiplexing.memory_fraction is not None:
        budget = int(device_memory_bytes(where) * multiplexing.memory_fraction)
        log.info("model memory budget: %.0f MiB (memoryFraction %g of %s)", budget / 2**20,
                 multiplexing.memory_fraction, where)
    sizer = ModelSizer(where)
    runtime.max_model_bytes = budget
    runtime.max_concurrent_loads = multiplexing.max_concurrent_loads
    runtime.load_timeout_s = multiplexing.load_timeout_seconds
    runtime.not_found_ttl_s = multiplexing.not_found_cache_seconds
    runtime.max_waiting_per_model = spec.max_ongoing_requests
    runtime.eviction_policy = multiplexing.eviction_policy
    runtime.model_size = sizer.size
    runtime.load_started = sizer.load_started
    # Beside a GPU the warm tier is host memory; on CPU the model is in host memory already,
    # so there it is a disk copy of the fetched file, kept by the loader (builtin.py).
    runtime.host_cache_bytes = multiplexing.host_cache_bytes
    runtime.warm_tier = HostTier(multiplexing.host_cache_bytes, where) \
        if where.type == "cuda" and multiplexing.host_cache_bytes else None


def build_handler(deployment: Deployment) -> Any:
    """An instance of ``spec.handler`` (or the built-in handler), built inside the
    replica's :func:`~modelplex.runtime.runtime_scope`.

    The manifest's folder is on the import path, so ``handler: "probe:Model"`` finds
    ``probe.py`` beside the manifest. A handler class may take a ``deployment`` argument.
    """
    spec = deployment.spec
    if spec.handler is None:
        from modelplex_replica.builtin import TorchScriptHandler

        source = spec.model_source
        if source is None:  # the spec's own validation refuses this first
            raise SpecError(["modelSource is required when no handler is given"])
        # A URI with a user and password comes through the environment, not the spec file.
        uri = os.environ.get(ENV_SOURCE_URI) or source.uri
        module_class = None
        if source.module is not None:  # format: safetensors; the class is imported as handlers are
            module_class = import_reference(source.module, "spec.modelSource.module", deployment)
        return TorchScriptHandler(uri, base_dir=deployment.base_dir, model_format=source.format,
                                  module_class=module_class, module_kwargs=source.kwargs)
    cls = import_reference(spec.handler, "spec.handler", deployment)
    # isinstance, not inspect.isclass: the type checker reads isclass as "a plain object's class".
    if isinstance(cls, type) and "deployment" in inspect.signature(cls).parameters:
        handler = cls(deployment=deployment)
    else:
        handler = cls() if isinstance(cls, type) else cls
    if spec.user_config is not None:  # Ray's user_config: given before the replica serves
        reconfigure_at_start(handler, spec.user_config)
    return handler


def import_reference(reference: str, field: str, deployment: Deployment) -> Any:
    """The callable ``module.path:Name`` names, with the manifest's folder on the import path;
    a :class:`SpecError` naming ``field`` when it cannot be imported or called."""
    if deployment.base_dir is not None and str(deployment.base_dir) not in sys.path:
        sys.path.insert(0, str(deployment.base_dir))
    module_name, _, class_name = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SpecError([f"{field}: cannot import {module_name!r}: {error}"]) from None
    found = getattr(module, class_name, None)
    if found is None:
        raise SpecError([f"{field}: {module_name!r} has no {class_name!r}"])
    if not callable(found):
        raise SpecError([f"{field}: {reference!r} is not callable"])
    return found
