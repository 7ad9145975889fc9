"""Every suite's conftest: what holds for all of tests/.

A bare ``pytest`` runs tests/unit and tests/integration (pyproject's ``testpaths``); the e2e
suite is opt-in by path (``pytest tests/e2e``, or ``pytest tests`` as ``make test`` runs it),
and every test under tests/e2e carries the ``e2e`` marker, so ``-m "not e2e"`` leaves it out
wherever it was named.

Tests marked ``cuda`` need a GPU: where torch sees none they are deselected (never skipped), so
the same command runs them on a GPU machine (``bench/gpu/run.sh`` does).
"""

from __future__ import annotations

from pathlib import Path

import pytest

E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
    cuda = [item for item in items if item.get_closest_marker("cuda") is not None]
    if cuda and not _has_cuda():
        config.hook.pytest_deselected(items=cuda)
        items[:] = [item for item in items if item.get_closest_marker("cuda") is None]


def _has_cuda() -> bool:
    import torch  # only when a cuda test was collected: the router's suites need no torch

    return torch.cuda.is_available()
