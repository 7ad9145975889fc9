"""Cache fixtures: a manifest beside a copy of weights.py, served by a real replica process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def manifest(tmp_path: Path):
    """Write a manifest for ``spec`` (merged over the Weights handler) and return its path."""

    def write(name: str = "weights", **spec) -> Path:
        shutil.copy(HERE / "weights.py", tmp_path / "weights.py")
        document = {
            "apiVersion": "modelplex.io/v1alpha1",
            "kind": "MultiplexedDeployment",
            "metadata": {"name": name},
            "spec": {"image": "local", "handler": "weights:Weights", **spec},
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(document))  # JSON is YAML
        return path

    return write
