"""Replica fixtures: a manifest beside a copy of probe.py, served by a real replica process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def manifest(tmp_path: Path):
    """Write a manifest for ``spec`` (merged over a Probe handler default) and return its path."""

    def write(name: str = "probe", **spec) -> Path:
        shutil.copy(HERE / "probe.py", tmp_path / "probe.py")
        document = {
            "apiVersion": "modelplex.io/v1alpha1",
            "kind": "MultiplexedDeployment",
            "metadata": {"name": name},
            "spec": {"image": "local", "handler": "probe:Probe", **spec},
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(document))  # JSON is YAML
        return path

    return write
