"""Loaded-model reporting: keep this replica's pod annotation equal to what its cache holds.

After every load and eviction the replica calls :meth:`AnnotationReporter.changed`; the
reporter patches ``modelplex.io/loaded-models`` on its own pod (POD_NAME / POD_NAMESPACE).
Bursts coalesce: at most one patch is in flight, and the next one carries the latest state,
so the router sees a change within about one API round trip. Outside a cluster it is off.
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


def annotation_patch(summary: LoadedSummary) -> dict[str, Any]:
    """The pod merge patch that publishes ``summary`` (fixed-size, whatever the models)."""
    return {"metadata": {"annotations": summary_annotations(summary)}}


class AnnotationReporter:
    """Coalescing publisher of the loaded-models document."""

    def __init__(self, snapshot: Callable[[], LoadedSummary], patch: Patch, *, settle_s: float = 0.01):
        self._snapshot = snapshot
        self._patch = patch
        self._settle_s = settle_s  # lets a burst of loads/evictions land in one patch
        self._dirty = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.published_version: int | None = None

    def changed(self) -> None:
        self._dirty.set()

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
            self._dirty.clear()
            summary = self._snapshot()
            try:
                await asyncio.to_thread(self._patch, annotation_patch(summary))
            except Exception as error:  # noqa: BLE001 - the API may be briefly away; keep trying
                log.warning("patching the loaded-models annotation failed (retrying in %.1f s): %s", backoff, error)
                self._dirty.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.2
            self.published_version = summary.version


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
