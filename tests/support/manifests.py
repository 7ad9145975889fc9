"""Manifests for tests that serve a handler module of their own through real processes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable


def handler_manifest(folder: Path, module: Path, name: str, **spec) -> Path:
    """A MultiplexedDeployment named ``name`` whose ``spec`` names a handler in ``module``
    (``handler: "module:Class"``), with ``module`` copied beside it: the replica imports it from
    the manifest's folder."""
    shutil.copy(module, folder / module.name)
    document = {
        "apiVersion": "modelplex.io/v1alpha1",
        "kind": "MultiplexedDeployment",
        "metadata": {"name": name},
        "spec": {"image": "local", **spec},
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    return path


def manifest_writer(folder: Path, module: Path, handler: str) -> Callable[..., Path]:
    """``write(name=<module's stem>, **spec)``: :func:`handler_manifest` of ``handler`` in
    ``module``, with ``spec`` merged over it (a test may name another handler)."""

    def write(name: str = module.stem, **spec) -> Path:
        return handler_manifest(folder, module, name, **{"handler": handler, **spec})

    return write


def deployments_file(folder: Path, specs: dict[str, dict]) -> str:
    """One manifest file of several MultiplexedDeployments (name → spec fields over a handler
    ``h:C`` that nothing imports): for tests that plan a local run without starting it."""
    documents = [{"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": name},
                  "spec": {"image": "local", "handler": "h:C", **spec}} for name, spec in specs.items()]
    path = folder / "deployments.yaml"
    path.write_text("\n---\n".join(json.dumps(d) for d in documents))
    return str(path)
