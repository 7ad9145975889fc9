"""The status keeper: the one writer of every MultiplexedDeployment's status.

Handlers *poke* it with a resource's key whenever something that status depends on changed
(the resource, one of its Deployments, one of its replica pods). A single task takes the poked
keys after a short pause (so a burst of annotation patches makes one write), refreshes them a
few at a time (:data:`CONCURRENCY`), computes each status from the indexes (:func:`modelplex_operator.status.compute_status`), and patches it
when it differs. It posts Events when Ready flips or a Deployment reports trouble. Before
computing, it reads the replicas' loaded-models documents whose summaries changed
(:mod:`modelplex_operator.documents`: per-model status, ModelLoadFailed Events).

It also repairs: a poke with ``repair=True`` (an owned Deployment was deleted, or the
periodic resync) applies the desired objects again, through the ``repair`` it was given
(:func:`modelplex_operator.handlers.reconcile.repair`, wired in :mod:`.lifecycle`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, Awaitable, Callable, Mapping

from modelplex_operator.credentials import upgrade_condition
from modelplex_operator.documents import ReplicaDocuments
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.observe import read_spec, resource_of
from modelplex_operator.handlers.reconcile import post
from modelplex_operator.kube import KubeError
from modelplex_operator.status import Key, compute_status, merge_conditions, status_differs, transitions
from modelplex_operator.user_config import UserConfigs

log = logging.getLogger("modelplex.operator.status")

DEBOUNCE_S = 0.2
RETRY_S = 5.0
#: Resources refreshed at once (more only queue at the API server's CPU).
CONCURRENCY = 4


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusKeeper:
    def __init__(
        self,
        ctx: OperatorContext,
        repair: Callable[[Mapping[str, Any]], Awaitable[Any]],
        *,
        debounce_s: float = DEBOUNCE_S,
        resync_s: float | None = None,
        clock: Callable[[], str] = utc_now,
        documents: ReplicaDocuments | None = None,
        concurrency: int = CONCURRENCY,
        user_configs: UserConfigs | None = None,
    ):
        self.ctx = ctx
        self.concurrency = concurrency
        self.repair = repair
        self.debounce_s = debounce_s
        self.resync_s = resync_s if resync_s is not None else ctx.config.resync_seconds
        self.clock = clock
        self.documents = documents or ReplicaDocuments(pods=ctx.pods)
        self.user_configs = user_configs or UserConfigs(ctx.pods)
        self._dirty: dict[Key, bool] = {}
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        # key -> (status written, resourceVersion the index showed when writing it)
        self._written: dict[Key, tuple[dict[str, Any], str | None]] = {}
        self.writes = 0

    # ------------------------------------------------------------------ inputs

    def poke(self, key: Key, *, repair: bool = False) -> None:
        """Refresh ``key`` soon (and apply its objects again with ``repair``)."""
        self._dirty[key] = self._dirty.get(key, False) or repair
        self._ensure_running()
        assert self._wake is not None
        self._wake.set()

    def _ensure_running(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._tasks = [task for task in self._tasks if not task.done()]
        if not self._tasks:
            loop = asyncio.get_running_loop()
            # Tasks copy this context: kopf's event poster is reachable from them.
            self._tasks.append(loop.create_task(self._run(), name="modelplex-status-keeper"))
            self._tasks.append(loop.create_task(self._resync(), name="modelplex-resync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
                pass
        self._tasks = []
        await self.documents.close()

    @property
    def alive(self) -> bool:
        return all(not task.done() for task in self._tasks)

    # ------------------------------------------------------------------ the loops

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.debounce_s)
            batch, self._dirty = self._dirty, {}
            # A few resources at a time (each refresh mostly waits on the API server), each key
            # once per batch: a burst of new deployments is not written one after the other.
            limit = asyncio.Semaphore(self.concurrency)

            async def refresh_one(key: Key, repair: bool) -> None:
                async with limit:
                    await self._refresh_or_retry_later(key, repair)

            await asyncio.gather(*(refresh_one(key, repair) for key, repair in batch.items()))

    async def _refresh_or_retry_later(self, key: Key, repair: bool) -> None:
        try:
            await self.refresh(key, repair=repair)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - keep the keeper alive; try again later
            log.warning("status of %s/%s not updated (%s); retrying in %.0fs", *key, error, RETRY_S)
            asyncio.get_running_loop().call_later(RETRY_S, self._poke_later, key, repair)

    def _poke_later(self, key: Key, repair: bool) -> None:
        try:
            self.poke(key, repair=repair)
        except RuntimeError:  # the loop is closing
            pass

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            if self.ctx.indexes is None:
                continue
            for key in self.ctx.indexes.resource_keys():
                self.poke(key, repair=True)

    async def _operator_conditions(self, key: Key, view: Mapping[str, Any]) -> list[dict[str, Any]]:
        """What the operator itself reports beside the serving conditions: ``CredentialUpgrade``
        (whose upgrade from a namespace credential ends here, once every pod has rolled) and the
        warnings of the last reconcile (:attr:`OperatorContext.warnings`)."""
        credentials, generation = self.ctx.credentials, int(view["metadata"].get("generation") or 1)
        ended = False
        if credentials.state(key) == "accepting":  # (an apply may be writing its Secret: not meanwhile)
            async with self.ctx.lock(key):
                ended = await asyncio.to_thread(credentials.settle, key, self.ctx.indexes.deployments_of(key)
                                                if self.ctx.indexes is not None else [])
        if ended:
            post(view, [("Normal", "CredentialUpgraded", "every pod has rolled: the namespace's credential is "
                         "refused from now on")])
        upgrade = upgrade_condition(credentials.state(key), key[1], generation)
        return [*([upgrade] if upgrade is not None else []), *self.ctx.warnings.get(key, {}).values()]

    # ------------------------------------------------------------------ one resource

    async def refresh(self, key: Key, *, repair: bool = False) -> dict[str, Any] | None:
        """Compute and (when it changed) write the status of ``key``; returns what was written."""
        indexes = self.ctx.indexes
        if indexes is None:
            return None
        view = indexes.resource(key)
        if view is None:  # deleted: forget it
            self._written.pop(key, None)
            self.ctx.forget(key)
            self.documents.forget(key)
            self.user_configs.forget(key)
            return None
        meta = view["metadata"]
        if meta.get("deletionTimestamp"):
            return None
        if repair:
            await self.repair(view)
        spec, problem = read_spec(view)  # parsed once, here
        resource = resource_of(view, spec, problem)
        written, seen_version = self._written.get(key, (None, None))
        base = dict(resource.status)
        if written is not None and seen_version == meta.get("resourceVersion"):
            base = {**base, **written}  # the index has not caught up with our last write yet
        resource = resource_of({**view, "status": base}, spec, problem)
        pods = indexes.pods_of(key)
        reading = await self.documents.read(key, pods)
        post(view, reading.events)
        if reading.retry_in is not None:  # a read failed: try it again then, even if nothing else changes
            asyncio.get_running_loop().call_later(reading.retry_in + 0.1, self._poke_later, key, False)
        # spec.userConfig to the ready replicas that have not applied it (Ray's reconfigure, no rollout).
        configs = await self.user_configs.sync(key, spec.user_config if spec is not None else None, pods,
                                               generation=resource.generation)
        post(view, configs.events)
        if configs.retry_in is not None:
            asyncio.get_running_loop().call_later(configs.retry_in + 0.1, self._poke_later, key, False)
        desired = compute_status(
            resource,
            indexes.deployments_of(key),
            pods,
            self.ctx.outcomes.get(key),
            self.clock(),
            reading.documents,
            reading.unreported,
        )
        # The autoscaler's own test of which resources it scales (handlers.autoscale), so an invalid
        # spec keeps its last autoscaling block.
        autoscaled = (view.get("spec") or {}).get("autoscaling") is not None
        autoscaling = self.ctx.autoscaling.get(key) if autoscaled else None
        if autoscaling is not None:  # the autoscaler's block and condition (handlers.autoscale)
            desired["autoscaling"] = autoscaling["status"]
            desired["conditions"].append(autoscaling["condition"])
        elif base.get("autoscaling") is not None:
            desired["autoscaling"] = None  # autoscaling turned off: a merge patch drops the block
        if configs.status is not None:
            desired["userConfig"] = configs.status
        elif base.get("userConfig") is not None:
            desired["userConfig"] = None  # userConfig removed: a merge patch drops the block
        conditions = await self._operator_conditions(key, view)
        if configs.condition is not None:
            conditions.append(configs.condition)
        desired["conditions"].extend(merge_conditions(base.get("conditions") or [], conditions, self.clock()))
        if not status_differs(base, desired):
            return None
        try:
            await self.ctx.kube.apatch_status(resource.namespace, resource.name, resource.uid, desired)
        except KubeError as error:
            if error.status in (404, 409, 422):  # gone, or replaced by a new object of that name
                log.info("status of %s/%s not written: %s", *key, error)
                return None
            raise
        self.writes += 1
        self._written[key] = (desired, meta.get("resourceVersion"))
        post(view, transitions(base, desired))
        return desired
