"""``modelplex replica``: serve one deployment's handler on the internal API."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from modelplex.runtime import runtime_scope
from modelplex.serving import ConnectionLimits, check_credential, check_unguarded_host, freeze_startup_objects, serve
from modelplex.wire.credentials import internal_token_file
from modelplex.wire.spec import Deployment
from modelplex_replica.app import STATE, create_app
from modelplex_replica.control import control_app
from modelplex_replica.handler import build_handler, runtime_for
from modelplex_replica.reporter import pod_patcher_from_environment

log = logging.getLogger("modelplex.replica")

#: How often a draining replica looks whether its requests are done.
_DRAIN_POLL_S = 0.05


def run_replica(deployment: Deployment, *, host: str, port: int, control_port: int | None = None) -> int:
    """Block serving (the API on ``port``, probes and metrics also on ``control_port``: see
    :mod:`modelplex_replica.control`) until SIGINT/SIGTERM, then drain within
    ``spec.gracefulShutdownTimeoutSeconds``. Returns the exit code: 1 when a port cannot be
    bound (logged, naming it)."""
    # The handler is built and served inside the replica's runtime: every task and thread its
    # calls run in (the user loop's included) carries it.
    internal = internal_token_file()
    if internal is None:
        check_unguarded_host(host, "replica")
    else:
        check_credential(internal, "replica")
    # Before user code runs: what it builds (a model in its constructor, one its reconfigure
    # swaps) stays the collector's to free, since a TorchScript module lives in reference cycles.
    freeze_startup_objects()
    with runtime_scope(runtime_for(deployment)) as runtime:
        handler = build_handler(deployment)
        app = create_app(deployment, handler, patch_pod=pod_patcher_from_environment(), runtime=runtime,
                         internal=internal)
        log.info("replica of %r serving on http://%s:%d (handler %s)%s", deployment.name, host, port,
                 deployment.spec.handler or _builtin_name(deployment),
                 f"; probes and metrics on http://{host}:{control_port}" if control_port else "")
        try:
            serve(control_app(app, host=host, port=port), host=host, port=control_port,
                  grace_s=deployment.spec.graceful_shutdown_timeout_seconds,
                  drain=lambda deadline: drain(app, deadline), name=f"replica of {deployment.name!r}",
                  limits=ConnectionLimits.of(deployment.spec.router))
        except OSError as error:
            log.error("cannot serve on %s (API port %d, control port %s): %s", host, port,
                      control_port if control_port is not None else "none", error)
            return 1
    return 0


async def drain(app: web.Application, deadline: float) -> None:
    """Turn not-ready and refuse new work (503: a router sends it elsewhere), still answering
    polls, until the requests in flight (streams, loads) are done or ``deadline`` passes (on the
    server loop, reading what the user loop counts)."""
    state = app[STATE]
    state.draining = True
    loop = asyncio.get_running_loop()
    while state.active > 0 and loop.time() < deadline:
        await asyncio.sleep(_DRAIN_POLL_S)
    if state.active:
        log.warning("%d request(s) still running at the end of the grace; cancelling them", state.active)


def _builtin_name(deployment: Deployment) -> str:
    source = deployment.spec.model_source
    return f"built-in, {source.format}" if source is not None else "built-in"
