"""Loaded-model reporting: keep this replica's pod annotation equal to what its cache holds.

After every load and eviction the replica calls :meth:`AnnotationReporter.changed`; the
reporter patches ``modelplex.io/loaded-models`` on its own pod (POD_NAME / POD_NAMESPACE).
Bursts coalesce: at most one patch is in flight, at most one starts per
:data:`MIN_PATCH_INTERVAL_S` (a stream of loads, evictions or failed loads costs the API server
one write a second per replica, whatever the rate), and each patch carries the latest state; a
state already published is not patched again. Outside a cluster it is off.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable

from modelplex.wire.loaded import LoadedSummary, summary_annotations
from modelplex.wire.names import ENV_POD_NAME, ENV_POD_NAMESPACE

log = logging.getLogger("modelplex.reporter")

Patch = Callable[[dict[str, Any]], None]
"""Applies a merge patch to the pod (blocking; run in a thread)."""
#: At most one pod patch per replica this often.
MIN_PATCH_INTERVAL_S = 1.0


def annotation_patch(summary: LoadedSummary) -> dict[str, Any]:
    """The pod merge patch that publishes ``summary`` (fixed-size, whatever the models)."""
    return {"metadata": {"annotations": summary_annotations(summary)}}


class AnnotationReporter:
    """Coalescing publisher of the loaded-models document."""

    def __init__(self, snapshot: Callable[[], LoadedSummary], patch: Patch, *, settle_s: float = 0.01,
                 min_interval_s: float = MIN_PATCH_INTERVAL_S, clock: Callable[[], float] | None = None):
        self._snapshot = snapshot
        self._patch = patch
        self._settle_s = settle_s  # lets a burst of loads/evictions land in one patch
        self._min_interval_s = min_interval_s
        self._clock = clock  # None: the event loop's clock
        self._dirty = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._patched_at: float | None = None
        self.published_version: int | None = None
        self.published: LoadedSummary | None = None
        #: Patches sent (tests and logs read it).
        self.patches = 0

    def changed(self) -> None:
        """The cache changed: publish its state with the next patch (coalesced)."""
        self._dirty.set()

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def start(self) -> None:
        self._dirty.set()  # publish the starting state
        self._task = asyncio.create_task(self._run(), name="annotation-reporter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self._settle_s)
            if self._patched_at is not None:
                wait = self._patched_at + self._min_interval_s - self._now()
                if wait > 0:
                    await asyncio.sleep(wait)  # changes meanwhile land in this one patch
            self._dirty.clear()
            summary = self._snapshot()
            if summary == self.published:
                continue  # nothing new since the last patch
            self._patched_at = self._now()
            try:
                self.patches += 1
                await asyncio.to_thread(self._patch, annotation_patch(summary))
            except Exception as error:  # noqa: BLE001 - the API may be briefly away; keep trying
                log.warning("patching the loaded-models annotation failed (retrying in %.1f s): %s", backoff, error)
                self._dirty.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.2
            self.published_version = summary.version
            self.published = summary


def pod_patcher_from_environment() -> Patch | None:
    """A patch function for this pod, or None outside a cluster (no POD_NAME / no API config)."""
    name, namespace = os.environ.get(ENV_POD_NAME), os.environ.get(ENV_POD_NAMESPACE)
    if not name or not namespace:
        log.info("loaded-model reporting is off: %s / %s are not set", ENV_POD_NAME, ENV_POD_NAMESPACE)
        return None
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as error:
            log.warning("loaded-model reporting is off: no Kubernetes API configuration (%s)", error)
            return None
    api = client.CoreV1Api()

    def patch(body: dict[str, Any]) -> None:
        api.patch_namespaced_pod(name, namespace, body, _request_timeout=10)

    log.info("reporting loaded models on pod %s/%s", namespace, name)
    return patch
