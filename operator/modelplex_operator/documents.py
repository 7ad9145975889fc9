"""The replicas' loaded-models documents, as the operator reads them for status and Events.

A replica pod's annotation carries only a fixed-size summary with a ``version``
(:class:`modelplex.wire.loaded.LoadedSummary`); the full document (every model, its size, the
latest load failures) is the replica's ``GET /v1/models``. :class:`ReplicaDocuments` reads it
from a ready pod's IP only when the pod's summary announces a version newer than the one
last read (or an older one: the replica restarted), so a quiet pool costs no requests.

Bounded: each read goes through the operator's client of its pods
(:mod:`modelplex_operator.pods`) with the limits of the one reader of the document
(:mod:`modelplex.loaded_client`: a time limit, a size limit), and at most
:data:`MAX_CONCURRENT_FETCHES` run at once. Failures are tolerated: the pod's last known
document stays in use, the failure is logged and reported (status condition
``ModelsReported``), and the pod is read again after a growing pause (:data:`RETRY_S`).

Load failures a document reports become Warning Events ``ModelLoadFailed`` naming the model,
at most one per model and resource every :data:`FAILURE_EVENT_INTERVAL_S` (5 minutes); an
Event posted after a quiet spell says how many failures were held back since the last one.
Failures of several models found in one round are one Event per reason, listing them
(:func:`aggregate_events`), so a burst of bogus ids is one API write, not one per id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from modelplex.loaded_client import FETCH_TIMEOUT_S, DocumentUnavailable
from modelplex.wire.loaded import LoadedModels, LoadFailure
from modelplex.wire.names import REPLICA_PORT
from modelplex_operator.pods import PodClient
from modelplex_operator.status import Key, PodView

log = logging.getLogger("modelplex.operator.documents")


MAX_CONCURRENT_FETCHES = 8
#: Pauses before reading a pod again after 1, 2, 3, ... failed reads in a row.
RETRY_S = (2.0, 5.0, 10.0, 30.0, 60.0)
#: At most one ModelLoadFailed Event per model and resource in this many seconds.
FAILURE_EVENT_INTERVAL_S = 300.0
EVENT_REASON = "ModelLoadFailed"
#: Kubernetes keeps at most 1 KiB of an Event's message.
EVENT_MESSAGE_CHARS = 1024


@dataclass
class _Known:
    """What the operator knows of one replica pod."""

    document: LoadedModels | None = None
    summary_version: int = -1  # the summary's version when the document was read
    error: str = ""  # why the latest read failed; "" after a good one
    failed_reads: int = 0
    retry_at: float = 0.0


@dataclass(frozen=True)
class NewFailure:
    """A load failure first seen in this reading: ``times`` new failed loads of ``failure.model``."""

    pod: str
    failure: LoadFailure
    times: int = 1


@dataclass(frozen=True)
class Reading:
    """What :meth:`ReplicaDocuments.read` knows after a round."""

    documents: dict[str, LoadedModels] = field(default_factory=dict)  # pod name -> last known
    unreported: dict[str, str] = field(default_factory=dict)  # pod name -> why its latest read failed
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message) to post
    retry_in: float | None = None  # seconds until a read that failed in this round is due again


# --------------------------------------------------------------------------- pure decisions


def wants_read(pod: PodView, known: _Known | None, now: float) -> bool:
    """Whether ``pod``'s document should be fetched now."""
    if not pod.ready or pod.deleting or not pod.ip:
        return False
    if known is None:
        return True
    if now < known.retry_at:
        return False
    if known.document is None:
        return True
    announced = pod.summary.version
    return announced > max(known.summary_version, known.document.version) or announced < known.summary_version


def new_failures(before: LoadedModels | None, after: LoadedModels, not_before: str) -> list[tuple[LoadFailure, int]]:
    """Failures in ``after`` that ``before`` did not have, with how many times each failed since.

    With no ``before`` (a pod read for the first time, or restarted), only failures at or after
    ``not_before`` (RFC 3339, UTC) count: an operator restart does not repeat old news.
    """
    if before is not None and after.version < before.version:
        before = None  # the replica restarted: its counts started again
    seen = {failure.model: failure.count for failure in before.failures} if before is not None else {}
    fresh = []
    for failure in after.failures:
        if before is None and failure.at < not_before:
            continue
        times = failure.count - seen.get(failure.model, 0)
        if times > 0:
            fresh.append((failure, times))
    return fresh


class EventLimiter:
    """At most one Event per (resource, model) every ``interval_s``; held-back ones are counted."""

    def __init__(self, interval_s: float = FAILURE_EVENT_INTERVAL_S):
        self.interval_s = interval_s
        self._posted: dict[tuple[Key, str], tuple[float, int]] = {}  # -> (posted at, failures held back since)

    def admit(self, key: Key, model: str, now: float, times: int = 1) -> int | None:
        """None: hold this one back; else how many failures were held back since the last Event."""
        posted = self._posted.get((key, model))
        if posted is not None and now - posted[0] < self.interval_s:
            self._posted[(key, model)] = (posted[0], posted[1] + times)
            return None
        self._posted[(key, model)] = (now, 0)
        self._prune(now)
        return posted[1] if posted is not None else 0

    def _prune(self, now: float) -> None:
        for entry, (posted_at, _) in list(self._posted.items()):
            if now - posted_at >= 2 * self.interval_s:
                del self._posted[entry]

    def forget(self, key: Key) -> None:
        for entry in [entry for entry in self._posted if entry[0] == key]:
            del self._posted[entry]


def failure_message(failure: NewFailure, held_back: int) -> str:
    message = f"model {failure.failure.model!r} failed to load on replica {failure.pod}: {failure.failure.error}"
    if failure.times > 1:
        message += f" ({failure.times} failed loads)"
    if held_back:
        message += f"; {held_back} more failed loads of it since the last Event"
    return message


def aggregate_events(events: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """One Event per (type, reason): several become one that counts and lists them (bounded)."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for kind, reason, message in events:
        grouped.setdefault((kind, reason), []).append(message)
    aggregated = []
    for (kind, reason), messages in grouped.items():
        text = messages[0] if len(messages) == 1 else f"{len(messages)} models failed to load: " + "; ".join(messages)
        if len(text) > EVENT_MESSAGE_CHARS:
            text = text[:EVENT_MESSAGE_CHARS - 3] + "..."
        aggregated.append((kind, reason, text))
    return aggregated


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


# --------------------------------------------------------------------------- the reader


class ReplicaDocuments:
    """The operator's reader of replica documents, keyed by resource and pod name."""

    def __init__(
        self,
        *,
        port: int = REPLICA_PORT,
        timeout_s: float = FETCH_TIMEOUT_S,
        concurrency: int = MAX_CONCURRENT_FETCHES,
        limiter: EventLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        pods: PodClient | None = None,
    ):
        """``pods``: the operator's client of its pods (it sends the credential); without one,
        a client of its own (no credential), closed with this reader."""
        self.port = port
        self.timeout_s = timeout_s
        self.limiter = limiter or EventLimiter()
        self._clock = clock
        self._wall_clock = wall_clock
        self._known: dict[Key, dict[str, _Known]] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._owns_pods = pods is None
        self._pods = pods if pods is not None else PodClient()

    async def read(self, key: Key, pods: Iterable[PodView]) -> Reading:
        """Bring the documents of ``key``'s replica pods up to date where their summaries say so."""
        live = {pod.name: pod for pod in pods if not pod.deleting}
        known = self._known.setdefault(key, {})
        for gone in set(known) - set(live):
            del known[gone]
        now = self._clock()
        due = [pod for pod in live.values() if wants_read(pod, known.get(pod.name), now)]
        results = await asyncio.gather(*(self._fetch(key, pod) for pod in due))
        not_before = _utc(self._wall_clock() - self.limiter.interval_s)
        events: list[tuple[str, str, str]] = []
        retry_in: float | None = None
        for pod, result in zip(due, results):
            entry = known.setdefault(pod.name, _Known())
            if isinstance(result, LoadedModels):
                for failure, times in new_failures(entry.document, result, not_before):
                    events.extend(self._event(key, NewFailure(pod.name, failure, times)))
                if entry.error:
                    log.info("%s/%s: read the models of replica %s again", *key, pod.name)
                entry.document, entry.summary_version = result, pod.summary.version
                entry.error, entry.failed_reads, entry.retry_at = "", 0, 0.0
            else:
                pause = RETRY_S[min(entry.failed_reads, len(RETRY_S) - 1)]
                entry.error, entry.failed_reads, entry.retry_at = result, entry.failed_reads + 1, now + pause
                retry_in = pause if retry_in is None else min(retry_in, pause)
                log.warning("%s/%s: GET /v1/models of replica %s failed (%s); keeping its last known models, "
                            "trying again in %.0f s", *key, pod.name, result, pause)
        return Reading(
            documents={name: entry.document for name, entry in known.items() if entry.document is not None},
            unreported={name: entry.error for name, entry in known.items() if entry.error},
            events=aggregate_events(events),
            retry_in=retry_in,
        )

    def _event(self, key: Key, failure: NewFailure) -> list[tuple[str, str, str]]:
        held_back = self.limiter.admit(key, failure.failure.model, self._clock(), failure.times)
        if held_back is None:
            log.info("%s/%s: model %r failed to load on %s again (Event held back: at most one per %.0f s)",
                     *key, failure.failure.model, failure.pod, self.limiter.interval_s)
            return []
        return [("Warning", EVENT_REASON, failure_message(failure, held_back))]

    async def _fetch(self, key: Key, pod: PodView) -> LoadedModels | str:
        """The pod's document, or why it could not be read."""
        async with self._slots:
            try:
                return await self._pods.loaded_models(key, pod.ip, port=self.port, timeout_s=self.timeout_s)
            except DocumentUnavailable as error:
                return str(error)

    def forget(self, key: Key) -> None:
        """The resource is gone."""
        self._known.pop(key, None)
        self.limiter.forget(key)

    async def close(self) -> None:
        if self._owns_pods:  # the operator's client is closed at the operator's cleanup
            await self._pods.close()
