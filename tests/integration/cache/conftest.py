"""Cache fixtures: a manifest beside a copy of weights.py, served by a real replica process."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from support.manifests import manifest_writer

HERE = Path(__file__).resolve().parent


@pytest.fixture
def manifest(tmp_path: Path) -> Callable[..., Path]:
    """Write a manifest for ``spec`` (merged over the Weights handler) and return its path."""
    return manifest_writer(tmp_path, HERE / "weights.py", "weights:Weights")
