"""``modelplex cluster up|down|status|load|build``.

``up`` starts a detached supervisor process that runs the control plane and the
node (see ``controlplane.py``), waits until the node is Ready, puts the project's
images on it, and prints shell lines for ``eval "$(modelplex cluster up)"``.
Everything else (progress, where the logs are) goes to stderr. ``down`` stops it
all and undoes the node's changes to the host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

from modelplex.processes import ProcessExited, WaitTimeout, log_tail, pid_alive, running, signal_group, spawn, wait_for

STATE_ENTRIES = ("pki", "etcd", "logs", "kubelet", "containerd", "pids", "kubeconfig", "ready", "endpoints.json",
                 "supervisor.pid", "supervisor.log", "Corefile", "kube-proxy.yaml")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cluster_dir() -> Path:
    env = os.environ.get("MODELPLEX_CLUSTER_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "modelplex" / "cluster"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _environ_has(pid: int, needle: str) -> bool:
    try:
        return needle.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _supervisor_pid(state: Path) -> int | None:
    pid = _read_pid(state / "supervisor.pid")
    if pid and pid_alive(pid) and "modelplex_cluster" in _cmdline(pid):
        return pid
    return None


def _exports(state: Path, bin_dir: str) -> str:
    kubeconfig = state / "kubeconfig"
    return (f"export KUBECONFIG={shlex.quote(str(kubeconfig))}\n"
            f"export PATH={shlex.quote(bin_dir)}:\"$PATH\"\n")


def _api_ready(state: Path) -> bool:
    try:
        info = json.loads((state / "ready").read_text())
    except (OSError, ValueError):
        return False
    import http.client
    import ssl
    import urllib.parse

    url = urllib.parse.urlsplit(info["server"])
    pki = state / "pki"
    try:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=3, context=ctx)
        conn.request("GET", "/readyz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except (OSError, ssl.SSLError, http.client.HTTPException):
        return False


# --------------------------------------------------------------------------- commands


def cmd_build(args) -> int:
    from modelplex_cluster.controlplane import ControlPlaneError, build_binaries, build_policy_agent

    try:
        print(build_binaries(force=args.force))
        build_policy_agent(force=args.force)
    except ControlPlaneError as exc:
        say(f"error: {exc}")
        return 1
    return 0


def cmd_up(args) -> int:
    from modelplex_cluster.controlplane import ControlPlaneError, build_binaries, build_policy_agent, restore_node_host

    state = cluster_dir()
    pid = _supervisor_pid(state)
    if pid and (state / "ready").exists():
        info = json.loads((state / "ready").read_text())
        say(f"cluster already running (supervisor pid {pid}, state in {state}); `modelplex cluster down` stops it")
        sys.stdout.write(_exports(state, info["bin_dir"]))
        return 0
    if pid:
        say(f"a cluster supervisor (pid {pid}) is running but not ready; stopping it first")
    _stop(state)  # also undoes what a killed supervisor left on the host

    try:
        bin_dir = build_binaries()
        policy_agent = build_policy_agent()
    except ControlPlaneError as exc:
        say(f"error: {exc}")
        return 1

    state.mkdir(parents=True, exist_ok=True)
    restore_node_host(state)
    for entry in STATE_ENTRIES:  # a fresh cluster each time
        path = state / entry
        if path.is_dir():
            import shutil

            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    log_path = state / "supervisor.log"
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
    env.pop("KUBECONFIG", None)
    argv = [sys.executable, "-m", "modelplex_cluster", "_serve", f"--bin-dir={bin_dir}", f"--state-dir={state}",
            f"--policy-agent={policy_agent}"]
    say(f"==> starting the control plane and the node (state and logs in {state})")
    # The supervisor outlives this command (death_signal=None): `cluster down` stops it.
    proc = spawn(argv, log=log_path, env=env, cwd=state, death_signal=None)
    (state / "supervisor.pid").write_text(f"{proc.pid}\n")
    t0 = time.monotonic()
    try:
        wait_for((state / "ready").exists, args.timeout, 0.3, "the control plane",
                 guard=lambda: running(proc, "the control plane"))
    except ProcessExited as error:
        say(f"error: {error} while starting; log: {log_path}")
        say(log_tail(log_path, 40))
        return 1
    except WaitTimeout:
        say(f"error: the control plane was not ready after {args.timeout:.0f}s; log: {log_path}")
        say(log_tail(log_path, 40))
        _stop(state)
        return 1
    say(f"==> cluster ready in {time.monotonic() - t0:.1f}s: kubeconfig {state / 'kubeconfig'}; logs in {state / 'logs'}")
    if not args.no_images:
        try:
            load_project_images(_node_socket(state))
        except Exception as exc:  # noqa: BLE001 - the cluster runs; say why the images are missing
            say(f"error: the cluster runs, but putting the project's images on the node failed: {exc}")
            sys.stdout.write(_exports(state, str(bin_dir)))
            return 1
    say('    (use: eval "$(modelplex cluster up)"; stop with: modelplex cluster down)')
    sys.stdout.write(_exports(state, str(bin_dir)))
    return 0


def _kill_leftovers(state: Path) -> list[str]:
    """Kill recorded component and pod processes that outlived the supervisor."""
    killed = []
    for pid_file in sorted((state / "pids").glob("*.pid")) if (state / "pids").exists() else []:
        pid = _read_pid(pid_file)
        name = pid_file.stem
        if pid and pid_alive(pid) and (name in _cmdline(pid) or "modelplex_cluster" in _cmdline(pid)):
            signal_group(pid, signal.SIGKILL)
            killed.append(f"{name} ({pid})")
    return killed


def _stop(state: Path, timeout: float = 180) -> bool:
    pid = _supervisor_pid(state)
    stopped = False
    if pid:
        os.kill(pid, signal.SIGTERM)
        try:
            wait_for(lambda: not pid_alive(pid), timeout, 0.2, f"supervisor {pid} to stop")
        except WaitTimeout:
            say(f"supervisor {pid} did not stop in {timeout:.0f}s; killing it")
            signal_group(pid, signal.SIGKILL)
        stopped = True
    leftovers = _kill_leftovers(state)
    if leftovers:
        say("killed leftover processes: " + ", ".join(leftovers))
    from modelplex_cluster.controlplane import clear_abandoned_node, restore_node_host

    undone = restore_node_host(state)  # left by a supervisor that was killed before it could
    undone += clear_abandoned_node()  # a node whose owner is gone (a killed test run, say)
    if undone:
        say("undid host changes: " + ", ".join(undone))
    (state / "ready").unlink(missing_ok=True)
    return stopped or bool(leftovers) or bool(undone)


def _node_socket(state: Path) -> Path | None:
    try:
        return Path(json.loads((state / "ready").read_text())["containerd_socket"])
    except (OSError, ValueError, KeyError):
        return None


def load_project_images(socket: Path) -> dict[str, str]:
    """Build (or reuse) the project's images, put those the node lacks on it, and give each its
    version tag too (``modelplex/router:0.1.0``: the chart's defaults); returns component -> tag."""
    from modelplex_cluster import images, node

    # One engine for the build and the save (ensure_images uses the one that answers).
    with images.docker_engine() as env:
        tags = images.ensure_images()
        version = images.project_version(images.repo_root())
        present = node.image_names(socket)
        missing = [tag for tag in tags.values() if node.normalize(tag) not in present]
        if missing:
            t0 = time.monotonic()
            say(f"==> putting {', '.join(missing)} on the node")
            node.load_docker_images(socket, missing, env=env)
            say(f"    loaded in {time.monotonic() - t0:.1f}s")
        for tag in tags.values():
            versioned = f"{tag.rsplit(':', 1)[0]}:{version}"
            try:
                node.tag_image(socket, tag, versioned)
            except node.NodeError as error:
                # Listed on the node a moment ago, gone now (seen once in CI, all e2e tests lost to
                # it; the node's image store outlives clusters): put it there again, once.
                say(f"==> {tag} is not on the node after all ({error}); putting it there again")
                node.load_docker_images(socket, [tag], env=env)
                node.tag_image(socket, tag, versioned)
    # Older content tags of our images go (the node's image store is kept between clusters;
    # containerd's collector then frees what only they held).
    current = {node.normalize(tag) for tag in tags.values()}
    ours = re.compile("|".join(re.escape(node.normalize(tag)[:-12]) + "[0-9a-f]{12}" for tag in tags.values()))
    superseded = sorted(name for name in present if name not in current and ours.fullmatch(name))
    if superseded:
        node.ctr(socket, "images", "remove", *superseded)
        say(f"    removed {len(superseded)} superseded image tags from the node")
    say("==> the project's images are on the node: " + ", ".join(f"{tag.rsplit(':', 1)[0]}:{version}"
                                                                 for tag in tags.values()))
    return tags


def cmd_load(args) -> int:
    from modelplex_cluster import node

    state = cluster_dir()
    socket = _node_socket(state)
    if not _supervisor_pid(state) or socket is None:
        say(f"error: no cluster running (state dir {state}); start one with: eval \"$(modelplex cluster up)\"")
        return 1
    t0 = time.monotonic()
    from modelplex_cluster import images

    try:
        # The engine that answers (DOCKER_HOST, the default socket), else the project's own.
        with images.docker_engine() as env:
            node.load_docker_images(socket, args.images, env=env)
    except (node.NodeError, images.ImageError, OSError) as exc:
        say(f"error: {exc}")
        return 1
    say(f"loaded {', '.join(args.images)} onto the node in {time.monotonic() - t0:.1f}s")
    return 0


def cmd_down(args) -> int:
    state = cluster_dir()
    if _stop(state):
        say(f"cluster stopped (state in {state})")
    else:
        say(f"no cluster running (state dir {state})")
    return 0


def cmd_status(args) -> int:
    state = cluster_dir()
    pid = _supervisor_pid(state)
    if not pid:
        print(f"not running (state dir {state})")
        return 1
    ready = _api_ready(state)
    print(f"running: supervisor pid {pid}, API {'ready' if ready else 'NOT ready'}")
    try:
        info = json.loads((state / "ready").read_text())
        print(f"server: {info['server']}")
        print(f"kubeconfig: {info['kubeconfig']}")
        print(f"binaries: {info['bin_dir']}")
        for name, p in info.get("pids", {}).items():
            print(f"  {name}: pid {p}{'' if pid_alive(p) else ' (gone)'}")
    except (OSError, ValueError, KeyError):
        pass
    print(f"logs: {state / 'logs'}")
    return 0 if ready else 1


def cmd_serve(args) -> int:
    from modelplex_cluster.controlplane import _supervise

    return _supervise([f"--bin-dir={args.bin_dir}", f"--state-dir={args.state_dir}",
                       *([f"--policy-agent={args.policy_agent}"] if args.policy_agent else [])])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="modelplex cluster",
        description="A local one-node Kubernetes cluster (etcd, kube-apiserver, kube-controller-manager, "
                    "kube-scheduler; containerd, the kubelet, kube-proxy, CoreDNS and kube-router's NetworkPolicy "
                    "firewall), for trying Modelplex "
                    'and for its end-to-end tests. Needs root. Start it with: eval "$(modelplex cluster up)"',
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build or reuse the binaries, start the cluster, print shell exports")
    up.add_argument("--timeout", type=float, default=300, help="seconds to wait for the node (default 300)")
    up.add_argument("--no-images", action="store_true", help="do not build or load the project's images")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop the cluster and its containers; undo its host changes").set_defaults(
        func=cmd_down)
    load = sub.add_parser("load", help="put local docker images on the node (docker save | ctr images import)")
    load.add_argument("images", nargs="+", metavar="IMAGE")
    load.set_defaults(func=cmd_load)
    sub.add_parser("status", help="say whether the cluster runs").set_defaults(func=cmd_status)
    build = sub.add_parser("build", help="build or reuse the binaries (the policy agent's too); print the "
                                         "control plane's folder")
    build.add_argument("--force", action="store_true", help="rebuild even when cached")
    build.set_defaults(func=cmd_build)
    serve = sub.add_parser("_serve")  # the detached supervisor started by `up`
    serve.add_argument("--bin-dir", required=True)
    serve.add_argument("--state-dir", required=True)
    serve.add_argument("--policy-agent", default=None)
    serve.set_defaults(func=cmd_serve)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
