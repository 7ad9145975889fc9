"""Cache fixtures: a manifest beside a copy of weights.py, served by a real replica process."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.manifests import handler_manifest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def manifest(tmp_path: Path):
    """Write a manifest for ``spec`` (merged over the Weights handler) and return its path."""

    def write(name: str = "weights", **spec) -> Path:
        return handler_manifest(tmp_path, HERE / "weights.py", name, **{"handler": "weights:Weights", **spec})

    return write
