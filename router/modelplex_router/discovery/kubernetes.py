"""Kubernetes discovery: watch the replica pods of a deployment, read their annotation.

Pods are selected by ``modelplex.io/deployment=<name>,modelplex.io/role=replica`` in the
router's namespace. Each pod gives a replica: its IP (and the container port named ``http``,
else 9000), its ``Ready`` condition, and the ``modelplex.io/loaded-models`` annotation.

The blocking ``kubernetes`` client runs in a daemon thread: list, then watch from the list's
resourceVersion; on a watch error it resumes from the last resourceVersion seen after a short
backoff, and on 410 Gone (that version is too old) it lists again. The translation from pod
events to table events (:class:`PodTracker`) is pure and tested with plain dicts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from typing import Any, Callable, Iterable

from modelplex.wire.loaded import LoadedSummary, annotation_summary
from modelplex.wire.names import LABEL_DEPLOYMENT, LABEL_ROLE, PORT_NAME, REPLICA_PORT, ROLE_REPLICA
from modelplex_router.discovery.base import Discovery
from modelplex_router.events import Event, ReplicaGone, ReplicaSeen, ReplicasListed
from modelplex_router.record import Held
from modelplex_router.table import RoutingTable

log = logging.getLogger("modelplex.router.discovery")

#: Server-side watch timeout: the watch is renewed (from the last resourceVersion) this often.
WATCH_TIMEOUT_S = 300
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


def selector(deployment: str) -> str:
    return f"{LABEL_DEPLOYMENT}={deployment},{LABEL_ROLE}={ROLE_REPLICA}"


def replica_port(pod: dict) -> int:
    """The container port named :data:`~modelplex.wire.names.PORT_NAME` of the pod, else the replica's default port."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return REPLICA_PORT


def replica_from_pod(pod: dict[str, Any]) -> ReplicaSeen | None:
    """The replica a pod (API JSON, camelCase keys) stands for; ``None`` without a name."""
    meta = pod.get("metadata") or {}
    name = meta.get("name")
    if not name:
        return None
    status = pod.get("status") or {}
    ip = status.get("podIP") or ""
    ready_condition = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    # A terminating pod may still show Ready for a while: send it nothing new.
    ready = bool(ip) and ready_condition and not meta.get("deletionTimestamp")
    summary = _summary(name, meta.get("annotations"))
    url = f"http://{_host(ip)}:{replica_port(pod)}" if ip else ""
    # The annotation is a summary: the table fetches the models when its version is news.
    return ReplicaSeen(name, url, ready, Held(summary))


def _summary(pod: str, annotations: dict[str, str] | None) -> LoadedSummary:
    try:
        return annotation_summary(annotations)
    except ValueError as error:
        log.warning("ignoring the malformed loaded-models annotation of pod %s: %s", pod, error)
        return LoadedSummary()


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


class PodTracker:
    """Turns a pod list and watch events into table events; remembers the resourceVersion."""

    def __init__(self) -> None:
        self.resource_version: str | None = None

    def on_list(self, pod_list: dict[str, Any]) -> list[Event]:
        """A ``list`` response (``{"metadata": {"resourceVersion"}, "items": [...]}``)."""
        self.resource_version = (pod_list.get("metadata") or {}).get("resourceVersion")
        seen = [info for info in map(replica_from_pod, pod_list.get("items") or ()) if info is not None]
        return [ReplicasListed(tuple(seen))]

    def on_event(self, event: dict[str, Any]) -> list[Event]:
        """One watch event ``{"type": ..., "object": {...}}``; raises :class:`Gone` on 410."""
        kind = event.get("type")
        obj = event.get("raw_object") or event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            if code == 410:
                self.resource_version = None
                raise Gone(obj.get("message", "resource version too old"))
            raise RuntimeError(f"watch error: {obj}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = version
        if kind == "BOOKMARK":
            return []
        info = replica_from_pod(obj)
        if info is None:
            return []
        if kind == "DELETED":
            return [ReplicaGone(info.name)]
        if kind in ("ADDED", "MODIFIED"):
            return [info]
        return []


def apply_all(table: RoutingTable, events: Iterable[Event], now: float) -> None:
    """Hand a tracker's events to the table (on the event loop)."""
    for event in events:
        table.apply(event, now)


class KubernetesDiscovery(Discovery):
    """Watches the replica pods of ``deployment`` in ``namespace``."""

    # The replica patches its annotation within ~100 ms of a change; the event then crosses
    # the API server. Trust the router's own observations for about a second over it.
    lag_s = 1.0

    def __init__(self, deployment: str, namespace: str):
        self.deployment = deployment
        self.namespace = namespace
        self.selector = selector(deployment)

    async def run(self, table: RoutingTable, clock: Callable[[], float]) -> None:
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def emit(events: list[Event]) -> None:
            if events:
                loop.call_soon_threadsafe(lambda: apply_all(table, events, clock()))

        thread = threading.Thread(target=self._watch_forever, args=(emit, stop), name="pod-watch", daemon=True)
        thread.start()
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            # The thread notices at its next event or watch renewal; it is a daemon and touches
            # nothing but this (now finished) loop through call_soon_threadsafe, which it guards.
            stop.set()

    def _watch_forever(self, emit: Callable[[list[Event]], None], stop: threading.Event) -> None:
        from kubernetes import client, config, watch  # heavy: only where the source is used
        from kubernetes.client.rest import ApiException

        def safe_emit(events: list[Event]) -> None:
            try:
                emit(events)
            except RuntimeError:  # the event loop is closed: the router is stopping
                stop.set()

        api = None
        tracker = PodTracker()
        backoff = BACKOFF_MIN_S
        while not stop.is_set():
            try:
                if api is None:
                    try:
                        config.load_incluster_config()
                    except config.ConfigException:
                        # KUBECONFIG as it is now (the client reads it once, at import), else ~/.kube/config
                        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
                    api = client.CoreV1Api(client.ApiClient())
                    log.info("watching pods %s in namespace %s", self.selector, self.namespace)
                if tracker.resource_version is None:
                    response = api.list_namespaced_pod(
                        self.namespace, label_selector=self.selector, _preload_content=False, _request_timeout=30
                    )
                    safe_emit(tracker.on_list(json.loads(response.data)))
                stream = watch.Watch().stream(
                    api.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=tracker.resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_TIMEOUT_S,  # also turns off the client's own 410 retry
                    _request_timeout=WATCH_TIMEOUT_S + 30,
                )
                for event in stream:
                    if stop.is_set():
                        return
                    if isinstance(event, dict):  # the client yields None for blank lines
                        safe_emit(tracker.on_event(event))
                    backoff = BACKOFF_MIN_S
            except Gone as gone:
                log.info("pod watch: %s; listing again", gone)
                tracker.resource_version = None
            except ApiException as error:
                if error.status == 410:
                    log.info("pod watch: resource version too old; listing again")
                    tracker.resource_version = None
                    continue
                log.warning("pod watch failed (%s %s); retrying in %.1f s", error.status, error.reason, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except Exception as error:  # noqa: BLE001 - a watch must survive anything the API does
                log.warning("pod watch failed (%s: %s); retrying in %.1f s", type(error).__name__, error, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
