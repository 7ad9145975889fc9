"""The real node: containerd + runc, a CNI bridge, and what the node changes on the host.

The node owns two bridges: ``mpx0`` carries the pods (``10.244.0.0/24``) and the node's own
address (``10.244.0.1``: the API server, the kubelet and CoreDNS listen there), and ``mpx-svc``
is empty: the Service CIDR is routed to it so that a packet to a ClusterIP that kube-proxy has
not (yet) rewritten is dropped here instead of following the default route off the machine.
Pods get routes to their bridge and to the Service CIDR only, no default route.

Everything the kubelet, kube-proxy, the policy agent (kube-router's firewall) and containerd
change on the host (iptables chains, ipsets, sysctls, links, network namespaces, mounts,
cgroups) is recorded by :func:`snapshot_host` before the node starts and undone by
:func:`restore_host`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

NODE_BRIDGE = "mpx0"
SERVICE_BRIDGE = "mpx-svc"
NODE_IP = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "modelplex.local/pause:catatonit"
CNI_BIN_DIR = "/usr/lib/cni"
NETNS_DIR = Path("/var/run/netns")
CNI_CACHE_DIR = Path("/var/lib/cni")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What the kubelet and kube-proxy may set; restored to the values they had before `up`.
SYSCTLS = (
    "kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "net.ipv4.conf.all.route_localnet",
    "net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established", "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
#: Which state dir the running node keeps its host record in (so `cluster down` finds any node).
REGISTRY = Path("/run/modelplex-node")
# The kubelet and kube-proxy pick the nft or the legacy backend, whichever holds rules: check both.
IPTABLES = ("iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy")
REQUIRED_COMMANDS = {"containerd": "containerd", "ctr": "containerd", "runc": "runc", "catatonit": "catatonit",
                     "iptables": "iptables", "ip": "iproute2", "ipset": "ipset"}
# The ipsets the policy agent (kube-router's firewall) makes: KUBE-SRC-*/KUBE-DST-* per policy,
# TMP-* while it swaps one in atomically, inet6:* for IPv6.
AGENT_IPSET_PREFIXES = ("KUBE-", "TMP-", "inet6:")


class NodeError(RuntimeError):
    """The node cannot start here; the message says why and what to install."""


def run(*argv: str, check: bool = True, input: bytes | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(argv, input=input, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise NodeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode(errors="replace")


def check_requirements() -> None:
    """Root, the Debian packages the node runs on, and no other node on this machine."""
    if os.geteuid() != 0:
        raise NodeError("the node needs root (it creates bridges, iptables rules and mounts)")
    missing = sorted({pkg for cmd, pkg in REQUIRED_COMMANDS.items() if shutil.which(cmd) is None})
    if not Path(CNI_BIN_DIR, "bridge").is_file():
        missing.append("containernetworking-plugins")
    if missing:
        raise NodeError(f"missing Debian packages for the node: apt-get install -y {' '.join(missing)}")
    if link_exists(NODE_BRIDGE):
        raise NodeError(f"bridge {NODE_BRIDGE} exists: another node runs on this machine, state in "
                        f"{registered_state()} (stop it with `modelplex cluster down`)")


# --------------------------------------------------------------------------- host state


def read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    Path("/proc/sys", *name.split(".")).write_text(value + "\n")


def links() -> list[str]:
    return sorted(line.split(":")[1].strip().split("@")[0] for line in run("ip", "-o", "link").splitlines())


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def mountpoints() -> list[str]:
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]


def kube_iptables_lines() -> list[str]:
    """Every iptables/ip6tables rule or chain that names a KUBE-* chain."""
    found = []
    for tool in IPTABLES:
        if shutil.which(f"{tool}-save"):
            found += [f"{tool}: {line}" for line in run(f"{tool}-save", check=False).splitlines() if "KUBE-" in line]
    return found


def agent_ipsets() -> list[str]:
    """The ipsets named like the policy agent's (see ``AGENT_IPSET_PREFIXES``)."""
    if shutil.which("ipset") is None:
        return []
    return sorted(name for name in run("ipset", "list", "-n", check=False).split()
                  if name.startswith(AGENT_IPSET_PREFIXES))


def remove_agent_ipsets(before: list[str]) -> list[str]:
    """Destroy the policy agent's ipsets that were not there before (after the iptables rules
    that use them are gone: a set in use cannot be destroyed); returns the ones destroyed."""
    made = [name for name in agent_ipsets() if name not in before]
    for name in made:
        run("ipset", "destroy", name, check=False)
    return made


def kube_cgroups() -> list[str]:
    return sorted(str(p) for p in CGROUP_ROOT.glob("*/kubepods*"))


def snapshot_host() -> dict:
    """What the node may change, as it is now (compare two with ``==``)."""
    return {
        "sysctls": {name: read_sysctl(name) for name in SYSCTLS},
        "links": links(),
        "netns": sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else None,
        # Only where the node mounts outside its state dir (other software on the machine
        # mounts and unmounts meanwhile); a test checks the state dir itself.
        "netns_mounts": [m for m in mountpoints() if m.startswith(os.path.realpath(NETNS_DIR) + "/")],
        "kube_iptables": kube_iptables_lines(),
        "ipsets": agent_ipsets(),
        "cgroups": kube_cgroups(),
        "cni_cache": CNI_CACHE_DIR.exists(),
    }


def _kube_rules_by_table(tool: str) -> dict[str, list[str]]:
    """``{table: [rules in -S form]}`` for the tables that name a KUBE-* chain. Read with
    ``<tool>-save``, which lists only tables that exist (``-t TABLE -S`` would create one)."""
    tables: dict[str, list[str]] = {}
    table = ""
    for line in run(f"{tool}-save", check=False).splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":KUBE-"):
            tables.setdefault(table, []).append("-N " + line[1:].split()[0])
        elif line.startswith("-A ") and "KUBE-" in line:
            tables.setdefault(table, []).append(line)
    return tables


def remove_kube_iptables() -> None:
    """Delete the jumps to KUBE-* chains from the built-in chains, then the KUBE-* chains (v4 and v6)."""
    for tool in IPTABLES:
        if not shutil.which(tool) or not shutil.which(f"{tool}-save"):
            continue
        for table, rules in _kube_rules_by_table(tool).items():
            for rule in rules:
                words = shlex.split(rule)
                if words[0] == "-A" and not words[1].startswith("KUBE-"):
                    run(tool, "-w", "-t", table, "-D", *words[1:], check=False)
            chains = [shlex.split(r)[1] for r in rules if r.startswith("-N ")]
            for chain in chains:
                run(tool, "-w", "-t", table, "-F", chain, check=False)
            for chain in chains:
                run(tool, "-w", "-t", table, "-X", chain, check=False)


def unmount_under(prefixes: list[str]) -> list[str]:
    """Unmount (lazily) every mount at or below one of ``prefixes``, deepest first."""
    prefixes = [p.rstrip("/") for p in prefixes]
    targets = [m for m in mountpoints() if any(m == p or m.startswith(p + "/") for p in prefixes)]
    for target in sorted(set(targets), key=len, reverse=True):
        run("umount", "-l", target, check=False)
    return targets


def remove_cgroups(before: list[str]) -> None:
    """rmdir the kubelet's cgroup trees that were not there before, leaves first."""
    for top in kube_cgroups():
        if top in before:
            continue
        for path in sorted(Path(top).rglob("*"), key=lambda p: len(p.parts), reverse=True) + [Path(top)]:
            if path.is_dir():
                try:
                    path.rmdir()
                except OSError:
                    pass


def kill_node_processes(socket: Path) -> int:
    """SIGKILL what outlived containerd: its shims and every process in the kubelet's cgroups."""
    pids = set()
    for top in kube_cgroups():
        for procs in Path(top).rglob("cgroup.procs"):
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except (OSError, ValueError):
                pass
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and str(socket).encode() in cmdline:
                pids.add(int(proc.name))
    pids.discard(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return len(pids)


def restore_host(state_dir: Path, before: dict) -> list[str]:
    """Undo what the node changed (the node's processes must be stopped); returns what was undone."""
    undone = []
    killed = kill_node_processes(state_dir / "containerd" / "containerd.sock")
    if killed:
        undone.append(f"{killed} leftover container processes")
        time.sleep(0.5)
    containerd_dirs = [str(state_dir / "containerd"), str(state_dir / "kubelet")]
    new_netns = [n for n in (sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else [])
                 if n not in (before.get("netns") or [])]
    # /proc/mounts names resolved paths (/var/run is a link to /run).
    mounts = unmount_under([os.path.realpath(p) for p in containerd_dirs + [str(NETNS_DIR / n) for n in new_netns]])
    if mounts:
        undone.append(f"{len(mounts)} mounts")
    for name in new_netns:
        (NETNS_DIR / name).unlink(missing_ok=True)
    if new_netns:
        undone.append(f"{len(new_netns)} network namespaces")
    if before.get("netns") is None and NETNS_DIR.is_dir() and not os.listdir(NETNS_DIR):
        NETNS_DIR.rmdir()
    for link in (NODE_BRIDGE, SERVICE_BRIDGE):
        if link_exists(link) and link not in before.get("links", []):
            run("ip", "link", "delete", link, check=False)
            undone.append(f"link {link}")
    if kube_iptables_lines():
        remove_kube_iptables()
        undone.append("KUBE-* iptables chains")
    ipsets = remove_agent_ipsets(before.get("ipsets") or [])
    if ipsets:
        undone.append(f"{len(ipsets)} ipsets")
    for name, value in (before.get("sysctls") or {}).items():
        if value is not None and read_sysctl(name) != value:
            write_sysctl(name, value)
            undone.append(f"{name}={value}")
    remove_cgroups(before.get("cgroups") or [])
    if not before.get("cni_cache") and CNI_CACHE_DIR.exists():
        shutil.rmtree(CNI_CACHE_DIR, ignore_errors=True)
    if registered_state() == state_dir:
        REGISTRY.unlink(missing_ok=True)
    return undone


# --------------------------------------------------------------------------- network


def registered_state() -> Path | None:
    try:
        return Path(REGISTRY.read_text().strip())
    except OSError:
        return None


def abandoned_state() -> Path | None:
    """The state dir of the registered node when no process runs from it any more (a test run or a
    supervisor killed before it could undo its host changes); None when none is registered or it runs.

    Every component of a node (etcd, the apiserver, containerd, the kubelet, ...) names a file under
    its state dir on its command line, so a node with none of them alive is gone for good."""
    state = registered_state()
    if state is None:
        return None
    needle = str(state).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    return None
            except OSError:
                continue
    return state


def setup_network(state_dir: Path) -> None:
    """The node bridge with the node address, and the Service CIDR routed nowhere."""
    REGISTRY.write_text(f"{state_dir}\n")
    run("ip", "link", "add", NODE_BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{NODE_IP}/{POD_CIDR.split('/')[1]}", "dev", NODE_BRIDGE)
    run("ip", "link", "set", NODE_BRIDGE, "up")
    # Forward only what enters from the pods' bridge (pod -> ClusterIP -> pod); the
    # machine's own forwarding setting stays as it is.
    write_sysctl(f"net.ipv4.conf.{NODE_BRIDGE}.forwarding", "1")
    run("ip", "link", "add", SERVICE_BRIDGE, "type", "bridge")
    run("ip", "link", "set", SERVICE_BRIDGE, "up")
    run("ip", "route", "add", SERVICE_CIDR, "dev", SERVICE_BRIDGE, "src", NODE_IP)


def cni_config(data_dir: Path) -> dict:
    return {
        "cniVersion": "0.4.0",
        "name": "modelplex",
        "plugins": [
            {
                "type": "bridge",
                "bridge": NODE_BRIDGE,
                # The bridge and its address are ours (setup_network): the plugin neither
                # takes the gateway address nor turns on the machine's IP forwarding.
                "isGateway": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(data_dir),
                    "ranges": [[{"subnet": POD_CIDR, "rangeStart": "10.244.0.10", "gateway": NODE_IP}]],
                    # No default route: pods reach their bridge and the Services, nothing else.
                    "routes": [{"dst": SERVICE_CIDR, "gw": NODE_IP}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


# --------------------------------------------------------------------------- containerd


def containerd_config(root: Path, state: Path, socket: Path, cni_conf_dir: Path) -> str:
    return f"""\
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{state}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # These machines run root without CAP_SYS_RESOURCE: runc may not lower a process's
  # oom_score_adj, which the CRI asks for every pod sandbox (-998). Clamp it instead.
  restrict_oom_score_adj = true
  disable_apparmor = true
  # Pods' network namespaces under our state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{state}/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf_dir}"
    max_conf_num = 1
"""


def cri_version(socket: Path, timeout: float = 5.0) -> bytes:
    """containerd's CRI answering ``RuntimeService/Version`` (raises until it does). Its socket
    answers ``ctr`` before the CRI plugin has initialised; a kubelet started then exits with
    "server is not initialized yet". The request is empty, so no CRI proto is needed."""
    import grpc

    with grpc.insecure_channel(f"unix://{socket}") as channel:
        version = channel.unary_unary("/runtime.v1.RuntimeService/Version",
                                      request_serializer=bytes, response_deserializer=bytes)
        return version(b"", timeout=timeout) or b"answered"


def ctr(socket: Path, *args: str, input: bytes | None = None, check: bool = True, timeout: float = 600) -> str:
    return run("ctr", "--address", str(socket), "--namespace", "k8s.io", *args, input=input, check=check,
               timeout=timeout)


def normalize(ref: str) -> str:
    """An image reference as containerd stores it (``modelplex/router:1`` is ``docker.io/modelplex/router:1``)."""
    first, _, rest = ref.partition("/")
    if not rest:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def image_names(socket: Path) -> set[str]:
    return set(ctr(socket, "images", "list", "--quiet").split())


def remove_all_containers(socket: Path) -> int:
    """Kill and delete every task and container in containerd's Kubernetes namespace."""
    for task in ctr(socket, "tasks", "list", "--quiet", check=False).split():
        ctr(socket, "tasks", "delete", "--force", task, check=False, timeout=60)
    containers = ctr(socket, "containers", "list", "--quiet", check=False).split()
    for container in containers:
        ctr(socket, "containers", "delete", container, check=False)
    return len(containers)


# --------------------------------------------------------------------------- images


def _tar_bytes(files: dict[str, tuple[bytes | str, int]]) -> bytes:
    """A reproducible tar: path -> (bytes, mode) for a file, (str target, 0) for a symlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in files} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            if isinstance(content, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, content, 0o777
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), mode
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def oci_archive(name: str, files: dict[str, tuple[bytes | str, int]], config: dict) -> bytes:
    """An OCI image layout (as a tar, for ``ctr images import``) of one layer made of ``files``."""
    layer = _tar_bytes(files)
    layer_gz = gzip.compress(layer, mtime=0)

    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    layer_digest, _ = blob(layer_gz)
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }, sort_keys=True).encode()
    config_digest, _ = blob(image_config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(image_config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest,
                    "size": len(layer_gz)}],
    }, sort_keys=True).encode()
    manifest_digest, _ = blob(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": len(manifest), "annotations": {"io.containerd.image.name": name,
                                               "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
    }]}).encode()
    entries = {"oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644), "index.json": (index, 0o644)}
    for data in (layer_gz, image_config, manifest):
        entries["blobs/sha256/" + hashlib.sha256(data).hexdigest()] = (data, 0o644)
    return _tar_bytes(entries)


def _blob(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_manifest(socket: Path, ref: str) -> dict:
    """The image manifest containerd holds for ``ref`` (the linux/amd64 one of an index)."""
    listing = ctr(socket, "images", "list", f"name=={normalize(ref)}").splitlines()[1:]
    if not listing:
        raise NodeError(f"image {ref} is not on the node")
    document = json.loads(ctr(socket, "content", "get", listing[0].split()[2]))
    while "manifests" in document:  # an index: the platform the node runs
        (entry,) = [m for m in document["manifests"]
                    if m.get("platform", {}).get("architecture", "amd64") == "amd64"][:1]
        document = json.loads(ctr(socket, "content", "get", entry["digest"]))
    return document


def derive_image(socket: Path, base: str, name: str, files: dict[str, tuple[bytes, int]]) -> None:
    """Put ``name`` on the node: the image ``base`` (already there) plus one layer of ``files``,
    as a Dockerfile of ``FROM base`` and ``COPY`` would make it. Only the new layer, the config and
    the manifest travel: the base's layers are shared in containerd's content store, where
    ``docker save | ctr images import`` would stream every layer of the base again (minutes for the
    replica image's 4.6 GB)."""
    manifest = image_manifest(socket, base)
    config = json.loads(ctr(socket, "content", "get", manifest["config"]["digest"]))
    layer = _tar_bytes(files)
    layer_gz = gzip.compress(layer, mtime=0)
    docker_media = manifest.get("mediaType", "").startswith("application/vnd.docker.")
    config["rootfs"]["diff_ids"].append(_blob(layer))
    config.setdefault("history", []).append({"created_by": f"modelplex: {len(files)} files on {base}"})
    config_bytes = json.dumps(config, sort_keys=True).encode()
    manifest = dict(manifest)
    manifest["config"] = dict(manifest["config"], digest=_blob(config_bytes), size=len(config_bytes))
    manifest["layers"] = [*manifest["layers"], {
        "mediaType": ("application/vnd.docker.image.rootfs.diff.tar.gzip" if docker_media
                      else "application/vnd.oci.image.layer.v1.tar+gzip"),
        "digest": _blob(layer_gz), "size": len(layer_gz)}]
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json"),
        "digest": _blob(manifest_bytes), "size": len(manifest_bytes),
        "annotations": {"io.containerd.image.name": normalize(name),
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
    }]}).encode()
    entries = {"oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644), "index.json": (index, 0o644)}
    for data in (layer_gz, config_bytes, manifest_bytes):
        entries["blobs/sha256/" + hashlib.sha256(data).hexdigest()] = (data, 0o644)
    import_image(socket, _tar_bytes(entries))


def pause_image() -> bytes:
    """The pod sandbox image: Debian's static catatonit, whose ``-P`` mode is a pause process."""
    binary = Path(shutil.which("catatonit") or "/usr/bin/catatonit").read_bytes()
    return oci_archive(PAUSE_IMAGE, {"catatonit": (binary, 0o755)},
                       {"Entrypoint": ["/catatonit", "-P"], "User": "65535:65535"})


def import_image(socket: Path, archive: bytes) -> None:
    ctr(socket, "images", "import", "-", input=archive)


def tag_image(socket: Path, source: str, target: str) -> None:
    ctr(socket, "images", "tag", "--force", normalize(source), normalize(target))


def load_docker_images(socket: Path, tags: list[str], env: dict | None = None) -> None:
    """``docker save TAG... | ctr images import -`` (what ``kind load docker-image`` does)."""
    try:
        save = subprocess.Popen(["docker", "save", *tags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        raise NodeError(f"docker save {' '.join(tags)}: {exc}") from None
    imp = subprocess.run(["ctr", "--address", str(socket), "--namespace", "k8s.io", "images", "import", "-"],
                         stdin=save.stdout, capture_output=True, timeout=1800)
    save.stdout.close()
    save_err = save.stderr.read().decode(errors="replace")
    if save.wait() != 0:
        raise NodeError(f"docker save {' '.join(tags)} failed: {save_err.strip()}")
    if imp.returncode != 0:
        raise NodeError(f"ctr images import failed: {imp.stderr.decode(errors='replace').strip()}")
