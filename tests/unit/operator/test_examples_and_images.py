"""The example manifests parse, and the Dockerfiles are consistent with what the pods run.

There is no Docker engine here: the images are checked for what can be checked without one
(base image, non-root user, the command the operator's pods use, the right extras, sources
that exist and that the Dockerfile's ignore file lets through).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from modelplex.spec import load_manifests

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples" / "operator").glob("*.yaml"))
DOCKERFILES = {name: ROOT / "docker" / f"{name}.Dockerfile" for name in ("operator", "router", "replica")}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_manifests_are_valid(path):
    (deployment,) = load_manifests(path)
    assert deployment.spec.replicas >= 1


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"recommender.yaml", "zoo.yaml"}


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        if fnmatch.fnmatch(path, pat.rstrip("/")) or fnmatch.fnmatch(path, pat.rstrip("/") + "/*"):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfiles(name):
    path = DOCKERFILES[name]
    steps = _instructions(path)
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for op, rest in steps if op == "ARG" and "=" in rest}
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    froms = [rest for op, rest in steps if op == "FROM"]
    assert froms and all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    # The final stage runs as a numeric non-root user (runAsNonRoot can check a numeric one).
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    users = [rest for op, rest in final if op == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    cmd = [rest for op, rest in final if op == "CMD"][-1]
    assert cmd == f'["modelplex", "{name}"]'
    installs = " ".join(rest for op, rest in steps if op == "RUN" and "pip" in rest)
    if name == "replica":
        assert '".[replica]"' in installs and '"modelplex[replica]"' in installs
    else:
        assert "[replica]" not in installs  # no torch outside the replica
    # Every COPY source exists and gets through the Dockerfile's .dockerignore.
    ignore = [line.strip() for line in (path.parent / f"{path.name}.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    for op, rest in steps:
        if op == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such file"
                assert not _ignored(source.rstrip("/"), ignore), f"{path.name}: {source} is in its .dockerignore"
    assert _ignored(".venv", ignore) and _ignored("tests", ignore)
