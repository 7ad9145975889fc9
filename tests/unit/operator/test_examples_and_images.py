"""The example manifests parse, and the Dockerfiles are consistent with what the pods run.

The images themselves are built and run in tests/integration/images; this checks what can be
checked without an engine: builds that need no registry (no `# syntax` line, no BuildKit-only
instruction, the base image a build argument), a numeric non-root user, the command the operator's
pods use, torch only in the replica, and sources that exist and that the ignore file lets through.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from modelplex.wire.spec import load_manifests
from modelplex_cluster.images import is_ignored, parse_dockerignore

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


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfiles(name):
    path = DOCKERFILES[name]
    text = path.read_text()
    # `# syntax=` makes BuildKit fetch a frontend image from a registry; RUN --mount needs BuildKit.
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    steps = _instructions(path)
    assert not [rest for op, rest in steps if op == "RUN" and rest.startswith("--mount")]
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for op, rest in steps if op == "ARG" and "=" in rest}
    assert args["BASE_IMAGE"] == "python:3.11-slim"
    froms = [rest for op, rest in steps if op == "FROM"]
    assert len(froms) == 2 and all(f.startswith("${BASE_IMAGE}") for f in froms)
    # The final stage runs as a numeric non-root user (runAsNonRoot can check a numeric one) and
    # takes only what was installed from the build stage: the dependencies' venv, then the project.
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    users = [rest for op, rest in final if op == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    # pip in the build stage trusts docker/ca/; the final stage copies nothing but the venv.
    assert ("COPY", "docker/ca/ ./ca/") in steps[:len(steps) - len(final)]
    assert [rest for op, rest in final if op == "COPY"] == [
        "--from=build /opt/modelplex /opt/modelplex", "--from=build /opt/app /opt/app"]
    assert any(op == "ENV" and "PATH=/opt/app/bin:/opt/modelplex/bin:$PATH" in rest for op, rest in final)
    # The project is on the venv's path through a .pth file, not PYTHONPATH: a pod that sets its
    # own PYTHONPATH (for its handler's code) must still find modelplex.
    assert not any(op == "ENV" and "/opt/app" in rest.partition("PYTHONPATH=")[2] for op, rest in final)
    assert any(op == "RUN" and "modelplex-app.pth" in rest and "/opt/app" in rest for op, rest in final)
    cmd = [rest for op, rest in final if op == "CMD"][-1]
    assert cmd == f'["modelplex", "{name}"]'
    installs = [rest for op, rest in steps if op == "RUN" and "install_deps.py" in rest]
    assert installs[-1].endswith("--project . --target /opt/app")
    if name == "replica":
        assert "--requirements replica.lock" in installs[0] and {"TORCH_VARIANT", "TORCH_INDEX_URL"} <= set(args)
    else:
        assert "--requirements base.lock" in installs[0]  # no torch outside the replica
    # Every COPY source exists and gets through the Dockerfile's .dockerignore.
    rules = parse_dockerignore((path.parent / f"{path.name}.dockerignore").read_text())
    for op, rest in steps:
        if op == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such file"
                assert not is_ignored(source.rstrip("/"), rules), f"{path.name}: {source} is in its .dockerignore"
    for left_out in (".venv", "tests", ".git", "cluster", "modelplex/__pycache__"):
        assert is_ignored(left_out, rules)


def test_the_images_version_tags_are_the_charts_defaults():
    """hack/images/build.sh tags each image `modelplex/<component>:<project version>`: the chart's
    default image tag is its appVersion, and the examples name the replica image so."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts/modelplex/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/modelplex/values.yaml").read_text())
    assert chart["appVersion"] == version
    assert values["image"]["repository"] == "modelplex/operator" and values["image"]["tag"] in ("", version)
    assert values["routerImage"]["repository"] == "modelplex/router" and values["routerImage"]["tag"] in ("", version)
    assert yaml.safe_load((ROOT / "examples/operator/zoo.yaml").read_text())["spec"]["image"] == f"modelplex/replica:{version}"
