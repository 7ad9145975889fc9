"""One deployment's router, whatever protocol its clients speak.

:class:`Router` owns what every front shares: the config and its access rules, the routing
table and the scheduler, the proxy and its client session, the cold gate and load quotas, the
metrics, the pinner, the draining flag, and the background tasks that keep the table current
(discovery, the document fetcher, the pinner). It makes the decisions both fronts answer with
(readiness, the load report, the repository's states, unloading). The fronts are siblings over
it: the HTTP API (:func:`modelplex_router.app.create_app`) and the Open Inference Protocol over
gRPC (:class:`modelplex_router.grpc.server.GrpcServer`); :mod:`modelplex_router.server` runs both.

Its lifetime is ``async with router:`` (or :meth:`Router.start` and :meth:`Router.close`): the
client session and the tasks exist between the two, and every task is cancelled and awaited
on close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Coroutine, TypeVar

import aiohttp

from modelplex.http import internal_session
from modelplex.wire.credentials import CallerTokens, ClientTokens, DeploymentCredential, TokenFile, internal_token_file
from modelplex.wire.errors import ReplicaFailed
from modelplex.wire.load import LoadReport
from modelplex_router import load
from modelplex_router.auth import Access, may_see
from modelplex_router.clients import KnownClients
from modelplex_router.cold import ColdGate
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.base import Discovery
from modelplex_router.discovery.documents import DocumentFetcher
from modelplex_router.door import LOADS, Route
from modelplex_router.endpoints import load_path, model_path
from modelplex_router.events import Unloaded
from modelplex_router.metrics import RouterMetrics
from modelplex_router.pins import Pinner
from modelplex_router.proxy import Proxy, Reply
from modelplex_router.quota import LoadQuotas
from modelplex_router.scheduler import Scheduler
from modelplex_router.upstream import UpstreamPool

log = logging.getLogger("modelplex.router")

T = TypeVar("T")


class Router:
    """A router for one deployment, its replicas found by ``discovery``; times from ``clock``."""

    def __init__(self, config: RouterConfig, discovery: Discovery, *,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.discovery = discovery
        self.clock = clock
        self.access = access_of(config)
        #: Set on SIGTERM: not ready (``/readyz``, gRPC health) while the requests in flight finish.
        self.draining = asyncio.Event()
        self.metrics = RouterMetrics(config.deployment, model_label=config.model_label)
        self.scheduler = scheduler = Scheduler(
            config.params,
            lag_s=discovery.lag_s,
            policy=config.policy,
            queue_timeout_s=config.queue_timeout_s,
            max_queued=config.max_queued,
            max_queued_requests=config.max_queued_requests,
            clock=clock,
            deployment=config.deployment,
            hold_at_zero_s=config.hold_at_zero_s,
            weight=config.models.weight,
            fair=config.queue_order == "fair",
        )
        # The scheduler's table: discovery, the document fetcher and the proxy tell it what they see.
        self.table = scheduler.table
        # A model's own series only once a replica has loaded it: ids clients make up never get one.
        self.metrics.label_loaded_only(lambda model: any(r.loaded(model) for r in self.table.holders(model)))
        self.metrics.queued.set_function(lambda: scheduler.queued)
        self.metrics.watch_queues(scheduler.waiting)
        #: Keeps ``spec.models`` ``minCopies`` placed and leased (:mod:`modelplex_router.pins`); None: none pinned.
        self.pinner: Pinner | None = None
        if config.pinned:
            self.pinner = pinner = Pinner(config.pinned, self.table, lambda: self.session, clock)
            self.metrics.pinned_placed.set_function(lambda: sum(len(m) for m in pinner.placement.replicas.values()))
            self.metrics.pinned_missing.set_function(lambda: sum(pinner.placement.missing.values()))
        # Made by start(): a client session belongs to a running loop.
        self._session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamPool | None = None
        self._proxy: Proxy | None = None
        self._cold: ColdGate | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifetime ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the client session and start discovery, the document fetcher and the pinner."""
        if self._session is not None:
            raise RuntimeError("the router is started already")
        config = self.config
        # The session of the router's own calls to replicas (pins, unloads); proxied requests
        # go through the upstream pool below.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = internal_session(
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s),
            skip_auto_headers=("User-Agent",),
            # A proxy keeps no cookies: one client's Set-Cookie must never reach another client.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        # The proxied requests' own client: lean keep-alive connections (modelplex_router.upstream).
        self._upstream = upstream = UpstreamPool(connect_timeout_s=config.connect_timeout_s,
                                                 idle_timeout_s=config.upstream_idle_s,
                                                 credential=internal_token_file())
        self._proxy = proxy = Proxy(self.scheduler, upstream, self.metrics,
                                    first_byte_timeout_s=config.first_byte_timeout_s,
                                    stream_idle_timeout_s=config.stream_idle_timeout_s, clock=self.clock)
        quota = config.load_quota
        self._cold = ColdGate(
            self.table, config.models, self.metrics, clock=self.clock,
            load=lambda model: proxy.exchange(model, b"", {}, _loaded, path=load_path(model)),
            quotas=LoadQuotas(quota.loads_per_minute, quota.burst, clock=self.clock) if quota else None,
            not_found_s=config.not_found_s,
        )
        self._spawn(self.discovery.run(self.table, self.clock), "discovery")
        self._spawn(DocumentFetcher().run(self.table, self.clock), "document fetcher")
        if self.pinner is not None:
            self._spawn(self.pinner.run(), "pinner")

    async def close(self) -> None:
        """Cancel the tasks and the background loads, wait for them, and close the session."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._cold is not None:
            await self._cold.close()
        if self._upstream is not None:
            await self._upstream.close()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> Router:
        await self.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(_report_crash)
        self._tasks.append(task)

    # -- what exists while it runs -------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        """The client session every request to a replica goes through."""
        return _started(self._session)

    @property
    def proxy(self) -> Proxy:
        """Sends requests to replicas through the scheduler (:mod:`modelplex_router.proxy`)."""
        return _started(self._proxy)

    @property
    def cold(self) -> ColdGate:
        """``onCold`` and the load quota (:mod:`modelplex_router.cold`)."""
        return _started(self._cold)

    # -- decisions both fronts answer with -----------------------------------------------------

    def drain(self) -> None:
        """Turn not-ready: the requests in flight finish, no new ones should come."""
        self.draining.set()

    def readiness(self) -> dict[str, Any]:
        """Ready while at least one replica is: a router with none can only answer 503. An
        autoscaled deployment's router is ready at zero replicas too: it holds the request that
        makes the autoscaler start one, so it must stay in its Service. (``/readyz``'s answer;
        the gRPC ``ServerReady`` and health service say the same.)"""
        ready = len(self.table.usable(self.clock()))
        holds = self.config.hold_at_zero_s is not None
        body: dict[str, Any] = {"ready": ready > 0 or holds, "replicas": len(self.table), "ready_replicas": ready}
        if self.draining.is_set():
            body["ready"] = False
            body["draining"] = True
        return body

    def load_report(self) -> LoadReport:
        """This router's load report for the autoscaler, now (:mod:`modelplex_router.load`)."""
        return load.report(self.table, self.scheduler, self.config.deployment, self.clock())

    def held(self, model: str) -> bool:
        """Whether a usable replica holds (or loads) the model now."""
        return any(replica.loaded(model) for replica in self.table.usable(self.clock()))

    def repository_states(self, caller: str) -> dict[str, str]:
        """Every model a replica holds (``READY``) or is loading (``LOADING``), by id, that
        ``caller`` may call (a client sees the models its globs allow, no others)."""
        states: dict[str, str] = {}
        for replica in self.table.usable(self.clock()):
            for model in replica.all_loading():
                states.setdefault(model, "LOADING")
            for model in replica.all_models():
                states[model] = "READY"
        return {model: state for model, state in sorted(states.items()) if may_see(self.access, caller, model)}

    def admit(self, route: Route, model: str, client: str | None, on_cold: str | None) -> None:
        """``onCold`` and the load quota for a request on ``route`` for ``model`` from ``client``
        (:func:`~modelplex_router.cold.quota_client`; None: not limited), ``on_cold``: the
        request's header or metadata. Every front calls this for every route that can start a
        load (:data:`~modelplex_router.door.LOADS`), before the request's body is read; 400,
        429 or 503 when it may not pass. An explicit load (model control) waits for its load
        whatever ``onCold`` says, and spends its client's quota like any other."""
        if route not in LOADS or not model:
            return
        self.cold.admit(model, client, "hold" if route is Route.LOAD else on_cold)

    async def unload(self, model: str) -> None:
        """Evict the model from every replica that holds it (502 naming those that failed)."""
        holders = [r for r in self.table.replicas() if r.holds(model)]
        path = model_path(model)

        async def evict(url: str) -> int:
            async with self.session.delete(url + path) as response:
                await response.read()
                return response.status

        statuses = await asyncio.gather(*(evict(r.url) for r in holders), return_exceptions=True)
        now = self.clock()
        for replica, status in zip(holders, statuses):
            if status in (200, 404):  # it holds the model no more: the index says so at once
                self.table.apply(Unloaded(replica, model), now)
        failed = [f"{r.name}: {s!r}" for r, s in zip(holders, statuses)
                  if isinstance(s, aiohttp.ClientError) or (isinstance(s, int) and s not in (200, 404))]
        errors = [s for s in statuses if isinstance(s, BaseException) and not isinstance(s, aiohttp.ClientError)]
        if errors:
            raise errors[0]
        if failed:
            raise ReplicaFailed(f"unloading {model!r} failed on {', '.join(failed)}")

    def pins(self) -> dict[str, Any] | None:
        """Where this router placed the pinned copies (``spec.models`` ``minCopies``), and what
        does not fit; None when nothing is pinned."""
        if self.pinner is None:
            return None
        placement = self.pinner.placement
        return {"placement": {n: list(m) for n, m in placement.replicas.items() if m}, "missing": placement.missing}


def access_of(config: RouterConfig) -> Access:
    """Who may call this router (:mod:`modelplex_router.auth`), from its config."""
    if config.auth is not None and config.client_tokens_dir is None:
        log.warning("spec.router.auth is set but no client tokens are mounted: every request gets 401")
    return Access(
        model_control=config.model_control,
        auth=config.auth,
        # A reloaded list naming a client "internal" is refused; the last good one stays.
        client_tokens=KnownClients(ClientTokens(Path(config.client_tokens_dir))) if config.client_tokens_dir else None,
        internal=internal_of(config),
        callers=CallerTokens(Path(config.caller_tokens_dir)) if config.caller_tokens_dir else None,
    )


def internal_of(config: RouterConfig) -> DeploymentCredential | None:
    """What this router takes for its own deployment's components: its deployment's credential,
    the namespace's during an upgrade from it, local mode's run credential (its scripts)."""
    if config.internal_token_file is None:
        return None
    legacy = TokenFile(Path(config.legacy_token_file)) if config.legacy_token_file else None
    run = (TokenFile(Path(config.run_token_file)),) if config.run_token_file else ()
    return DeploymentCredential(Path(config.internal_token_file), legacy, run)


def _started(part: T | None) -> T:
    if part is None:
        raise RuntimeError("the router is not started (async with router, or await router.start())")
    return part


async def _loaded(reply: Reply) -> int:
    """A background load's answer, its status: the gate logs a failure and remembers a 404."""
    return reply.status


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r", task.get_name(), task.exception(), exc_info=task.exception())
