"""The ``modelplex`` command: local mode, the replica and router servers, the operator, the cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from modelplex.logs import TEXT_FORMAT, configure
from modelplex.wire.names import ENV_SPEC, REPLICA_CONTROL_PORT, REPLICA_PORT
from modelplex.wire.ready import ENV_READY_FILE, READY_FILE_OPTION
from modelplex.wire.spec import DEFAULT_ROUTER_PORT, Deployment, SpecError, load_manifest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelplex", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"), help="debug, info, warning")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    local = commands.add_parser("local", help="run whole deployments (router + replicas) on this machine")
    local.add_argument("manifests", nargs="+", metavar="MANIFEST", help="a manifest, or a Ray Serve app: app.py:app")
    local.add_argument("--port", type=int, default=DEFAULT_ROUTER_PORT, help="the first router's port (default %(default)s)")
    local.add_argument("--host", default="127.0.0.1")
    local.add_argument(READY_FILE_OPTION, metavar="PATH", default=os.environ.get(ENV_READY_FILE),
                       help="once ready, write where each deployment answers to PATH as JSON (removed at exit; "
                            f"default: ${ENV_READY_FILE})")

    build = commands.add_parser("build", help="write a Ray Serve application's deployments as manifests")
    build.add_argument("app", metavar="APP", help="app.py:app or package.module:app (an application, X.bind(...))")
    build.add_argument("--image", required=True, help="the replica image; it holds the application's module")
    build.add_argument("-o", "--output", default="-", help="the manifests file (default: stdout)")
    build.add_argument("--namespace", help="metadata.namespace of every manifest")
    build.add_argument("--name", help="the application's name: it prefixes its deployments' names "
                                      "(two applications may then share a namespace and deployment names)")

    replica = commands.add_parser("replica", help="run one replica server")
    replica.add_argument("--spec", default=os.environ.get(ENV_SPEC), help=f"manifest file (default: ${ENV_SPEC})")
    replica.add_argument("--name", help="which deployment of a multi-document manifest")
    replica.add_argument("--host", default=os.environ.get("POD_IP", "127.0.0.1"))
    replica.add_argument("--port", type=int, default=REPLICA_PORT)
    replica.add_argument("--control-port", type=int, default=None,
                         help=f"also answer /healthz, /readyz and /metrics here, at once while user code computes "
                              f"(pods: {REPLICA_CONTROL_PORT}; default: none)")

    router = commands.add_parser("router", help="run the router")
    router.add_argument("--spec", default=os.environ.get(ENV_SPEC), help=f"manifest file (default: ${ENV_SPEC})")
    router.add_argument("--name", help="which deployment of a multi-document manifest")
    router.add_argument("--host", default=os.environ.get("POD_IP", "127.0.0.1"))
    router.add_argument("--port", type=int, default=DEFAULT_ROUTER_PORT)
    router.add_argument("--grpc-port", type=int, default=None,
                        help="the Open Inference Protocol's gRPC port (default: spec.router.grpcPort, else a free one)")
    router.add_argument("--control-port", type=int, default=None,
                        help="/healthz, /readyz and /metrics for probes and scrapers, answered however busy the "
                             "public port is (default: spec.router.controlPort, else a free one, logged)")
    router.add_argument("--picker-port", type=int, default=None,
                        help="the Endpoint Picker's ext_proc port, with spec.router.endpointPicker.enabled (default: "
                             "spec.router.endpointPicker.port, else a free one, logged)")
    router.add_argument("--replica", action="append", default=[], metavar="URL", help="static replica URL (repeat)")

    commands.add_parser("operator", help="run the kopf operator (in-cluster or from KUBECONFIG)")

    cluster = commands.add_parser("cluster", help="a local Kubernetes control plane for trying things")
    cluster.add_argument("args", nargs=argparse.REMAINDER, help="up | down | status | build")
    return parser


def _deployment(args: argparse.Namespace) -> Deployment:
    """The manifest of a router or replica; its ``spec.logging`` applies from here on."""
    if not args.spec:
        raise SpecError([f"no manifest: pass --spec FILE or set {ENV_SPEC}"])
    deployment = load_manifest(args.spec, args.name)
    configure(deployment.spec.logging)
    return deployment


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=TEXT_FORMAT,
        stream=sys.stderr,
    )
    try:
        if args.command == "replica":
            from modelplex.serving import UnguardedHost
            from modelplex_replica.server import run_replica

            try:
                return run_replica(_deployment(args), host=args.host, port=args.port, control_port=args.control_port)
            except UnguardedHost as error:
                print(f"modelplex replica: {error}", file=sys.stderr)
                return 2
        if args.command == "router":
            from modelplex_router.server import picker_port_of, run_router

            deployment = _deployment(args)
            grpc_port = args.grpc_port if args.grpc_port is not None else deployment.spec.router.grpc_port or 0
            control_port = args.control_port if args.control_port is not None else deployment.spec.router.control_port or 0
            picker_port = picker_port_of(deployment, in_pod=False)
            if picker_port is not None and args.picker_port is not None:
                picker_port = args.picker_port
            return run_router(deployment, host=args.host, port=args.port, replica_urls=args.replica,
                              grpc_port=grpc_port, control_port=control_port, picker_port=picker_port)
        if args.command == "local":
            from modelplex.serve.build import local_manifests
            from modelplex_launcher.local import run_local

            with local_manifests(args.manifests) as manifests:
                return run_local(manifests, host=args.host, port=args.port, ready_file=args.ready_file)
        if args.command == "build":
            from modelplex.serve.build import build

            return build(args.app, image=args.image, output=args.output, namespace=args.namespace, name=args.name)
        if args.command == "operator":
            from modelplex_operator.main import run_operator

            return run_operator()
        if args.command == "cluster":
            from modelplex_cluster import main as cluster_main

            return cluster_main(args.args)
    except SpecError as error:
        print(f"modelplex: invalid manifest: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
