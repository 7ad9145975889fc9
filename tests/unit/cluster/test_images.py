"""What goes into an image, and the tag that names it (cluster/modelplex_cluster/images.py)."""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from modelplex_cluster import images
from modelplex_cluster.images import content_hash, context_archive, context_files, is_ignored, parse_dockerignore

ROOT = Path(__file__).resolve().parents[3]

RULES = parse_dockerignore("""
# only the sources
*
!docker/install_deps.py
!pyproject.toml
!modelplex/
**/__pycache__
**/*.pyc
""")


@pytest.mark.parametrize(("path", "ignored"), [
    ("pyproject.toml", False),
    ("modelplex/wire/spec.py", False),
    ("modelplex/deep/er/module.py", False),
    ("modelplex/__pycache__/spec.cpython-311.pyc", True),
    ("modelplex/deep/__pycache__", True),
    ("modelplex/deep/stray.pyc", True),
    ("docker/install_deps.py", False),
    ("docker/router.Dockerfile", True),
    (".venv/bin/python", True),
    ("tests/unit/test_spec.py", True),
    ("README.md", True),
])
def test_dockerignore_rules_decide_by_the_last_match_on_the_path_or_a_parent(path, ignored):
    assert is_ignored(path, RULES) is ignored


def test_dockerignore_patterns_follow_dockers_syntax():
    rules = parse_dockerignore("/build\ndata/*.csv\nlog?.txt\n[ab].md\n!a.md\nweird\\*name\n")
    assert is_ignored("build/x.o", rules)
    assert is_ignored("data/x.csv", rules) and not is_ignored("data/sub/x.csv", rules)
    assert is_ignored("log1.txt", rules) and not is_ignored("log12.txt", rules)
    assert is_ignored("b.md", rules) and not is_ignored("a.md", rules)
    assert is_ignored("weird*name", rules) and not is_ignored("weirdXname", rules)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_context_holds_exactly_the_files_the_rules_let_through(tmp_path):
    _tree(tmp_path, {
        "pyproject.toml": "[project]\n", "modelplex/a.py": "a", "modelplex/sub/b.py": "b",
        "modelplex/__pycache__/a.pyc": "x", "docker/install_deps.py": "i", "docker/x.Dockerfile": "F",
        ".venv/lib/site.py": "v", "tests/test_a.py": "t",
    })
    assert context_files(tmp_path, RULES) == [
        "docker/install_deps.py", "modelplex/a.py", "modelplex/sub/b.py", "pyproject.toml"]


def test_the_context_archive_depends_on_contents_and_modes_not_on_times(tmp_path):
    _tree(tmp_path, {"pyproject.toml": "[project]\n", "modelplex/a.py": "a", "docker/x.Dockerfile": "FROM x\n"})
    files = context_files(tmp_path, RULES)
    first = context_archive(tmp_path, "docker/x.Dockerfile", files)
    os.utime(tmp_path / "modelplex/a.py", (1, 1))
    assert context_archive(tmp_path, "docker/x.Dockerfile", files) == first

    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        assert tar.getnames() == ["docker/x.Dockerfile", "modelplex/a.py", "pyproject.toml"]
        assert tar.extractfile("modelplex/a.py").read() == b"a"
        assert {m.mtime for m in tar.getmembers()} == {images.CONTEXT_MTIME}

    (tmp_path / "modelplex/a.py").chmod(0o755)
    assert context_archive(tmp_path, "docker/x.Dockerfile", files) != first
    (tmp_path / "modelplex/a.py").chmod(0o644)
    (tmp_path / "modelplex/a.py").write_text("A")
    assert context_archive(tmp_path, "docker/x.Dockerfile", files) != first


def test_the_content_hash_names_the_archive_the_arguments_and_the_base():
    one = content_hash(b"tar", {"TORCH_VARIANT": "cpu", "BASE_IMAGE": "b"}, "b")
    assert re.fullmatch(r"[0-9a-f]{12}", one)
    assert content_hash(b"tar", {"BASE_IMAGE": "b", "TORCH_VARIANT": "cpu"}, "b") == one
    assert content_hash(b"tar2", {"TORCH_VARIANT": "cpu", "BASE_IMAGE": "b"}, "b") != one
    assert content_hash(b"tar", {"TORCH_VARIANT": "cuda", "BASE_IMAGE": "b"}, "b") != one
    assert content_hash(b"tar", {"TORCH_VARIANT": "cpu", "BASE_IMAGE": "b"}, "c") != one


@pytest.fixture
def checkout(tmp_path):
    """A copy of what the images are built from, plus files that are not."""
    for name in ("docker", "modelplex", "replica", "router", "operator"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    return _tree(tmp_path, {"tests/test_x.py": "t", ".venv/x": "v", "cluster/modelplex_cluster/x.py": "c"})


def test_plans_tag_each_image_by_content_and_by_the_projects_version(checkout):
    plans = {p.component: p for p in images.plan_images(checkout, "modelplex/base:x", "cpu")}
    assert sorted(plans) == ["envoy", "operator", "replica", "router"]
    version = images.project_version(checkout)
    for component, plan in plans.items():
        flavour = f"{version}-cpu" if component == "replica" else version
        assert re.fullmatch(rf"modelplex/{component}:{re.escape(flavour)}-[0-9a-f]{{12}}", plan.tag)
        assert plan.version_tag == f"modelplex/{component}:{version}"
        assert plan.stage_tag == plan.tag.replace(f"/{component}:", f"/{component}-build:")
        assert plan.build_args["BASE_IMAGE"] == "modelplex/base:x"
        names = plan.files
        assert "docker/install_deps.py" in names and "docker/ca/README.md" in names
        # Envoy's image holds the package alone; the others the project.
        assert ("modelplex/wire/spec.py" in names) == (component != "envoy")
        assert not [n for n in names if n.startswith(("tests/", ".venv/", "cluster/")) or "__pycache__" in n]
    assert plans["replica"].build_args["TORCH_VARIANT"] == "cpu"
    assert "TORCH_VARIANT" not in plans["router"].build_args


def test_only_a_change_to_what_goes_in_changes_the_tags(checkout):
    def tags(**kw):
        return {p.component: p.tag for p in images.plan_images(checkout, kw.get("base", "b"), kw.get("variant", "cpu"))}

    before = tags()
    (checkout / "tests/test_x.py").write_text("changed")
    (checkout / "cluster/modelplex_cluster/x.py").write_text("changed")
    (checkout / "modelplex/__pycache__").mkdir(exist_ok=True)
    (checkout / "modelplex/__pycache__/spec.cpython-311.pyc").write_bytes(b"\0")
    assert tags() == before

    with (checkout / "router/modelplex_router/__init__.py").open("a") as f:
        f.write("\n# changed\n")
    after = tags()
    assert all(after[c] != before[c] for c in images.PROJECT_COMPONENTS)  # each installs the whole package
    assert after["envoy"] == before["envoy"]  # Envoy alone: the project's sources are not in it

    (checkout / "docker/replica.Dockerfile").write_text((checkout / "docker/replica.Dockerfile").read_text() + "\n")
    assert {c for c, t in tags().items() if t != after[c]} == {"replica"}
    assert tags(variant="cuda")["replica"] != after["replica"] and tags(base="other") != after


def test_the_local_base_is_named_by_its_recipe():
    assert re.fullmatch(r"modelplex/base:bookworm-[0-9a-f]{10}", images.local_base_ref())
    assert images.local_base_ref() == images.local_base_ref()


def test_an_unknown_replica_variant_is_refused(checkout):
    with pytest.raises(images.ImageError, match="cpu or cuda"):
        images.plan_images(checkout, "b", "rocm")


def test_the_extra_ca_defaults_to_what_the_hosts_pip_trusts(tmp_path, monkeypatch):
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n")
    monkeypatch.delenv("MODELPLEX_EXTRA_CA", raising=False)
    monkeypatch.setenv("PIP_CERT", str(pem))
    assert images._extra_ca() == pem.read_bytes()
    monkeypatch.setenv("MODELPLEX_EXTRA_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(images.ImageError, match="missing.pem"):
        images._extra_ca()
    monkeypatch.delenv("MODELPLEX_EXTRA_CA")
    monkeypatch.delenv("PIP_CERT")
    assert images._extra_ca() is None


def test_without_an_engine_or_dockerd_outside_ci_the_message_says_what_to_install(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(images.ImageError, match=r"apt-get install -y docker\.io"):
        images._apt_install(["docker.io"], "no Docker engine runs")
