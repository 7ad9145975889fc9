"""Which suites a bare ``pytest`` runs, and which ``make test`` (and so CI) runs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"{target}:", line))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_a_bare_pytest_runs_the_unit_and_integration_suites_but_not_e2e():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert options["testpaths"] == ["tests/unit", "tests/integration"]
    assert "e2e" in " ".join(options["markers"])


def test_make_test_runs_every_suite_and_ci_runs_make_test():
    (command,) = [line for line in _make_recipe("test") if "pytest" in line]
    paths = [word for word in command.split("pytest", 1)[1].split() if not word.startswith("-")]
    assert paths == ["tests"] or {"tests/unit", "tests/integration", "tests/e2e"} <= set(paths), command
    assert {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "support"
            and not p.name.startswith((".", "_"))} == {"unit", "integration", "e2e"}
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)
