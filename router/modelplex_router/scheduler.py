"""Turning the policy's answers into leases on replicas: waiting, bounds, bookkeeping.

:meth:`Scheduler.acquire` asks the policy for a replica. When the answer is "wait", the
request joins its model's line (:class:`modelplex_router.fairness.FairLine`). Whenever a slot
frees up, the scheduler walks the models in weighted fair order (``spec.models[].weight``; a
model alone takes every slot), each model's waiters oldest first, asks the policy for each
and hands the slot straight to the first one it suits (so a newcomer cannot take it first,
and one freed slot costs a few policy runs, not one per waiter). A waiter also looks for
itself when its matching timeout passes. A request that
finds no ready replica waits in the same line (a replica may be starting, or briefly out of
rotation): an instant 503 would only make clients resend at once. Past the queue bound a
request is refused with 503 and Retry-After rather than queued for ever; the bound is per
model (``max_queued`` waiters of each model, and ``QUEUED_TOTAL_FACTOR`` times that for all
models together, a memory bound), so one model's flood is refused for that model only.
``max_queued_requests`` (``spec.router.maxQueuedRequests``, Ray's option) bounds the waiters of
all models together: past it a new request is refused at once with Ray's ``BackPressureError``.

An autoscaled deployment may be at zero replicas on purpose: a request that finds none ready
is held longer (``hold_at_zero_s``, a minute by default), counted in :attr:`Scheduler.queued`,
which the load report carries to the autoscaler; that starts a replica, and the request goes
to it once it is ready. The scheduler also counts each request's model (:attr:`Scheduler.demand`)
for the report's request rates.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Callable, Collection, cast

from modelplex.wire.errors import BackPressureError, NotReady, Overloaded
from modelplex_router.config import DEFAULT_POLICY, DEFAULT_QUEUE_TIMEOUT_S
from modelplex_router.demand import RequestRates
from modelplex_router.events import RequestFinished, RequestStarted
from modelplex_router.fairness import FairLine
from modelplex_router.policy import POLICIES, Decision, Kind, Params
from modelplex_router.record import Replica
from modelplex_router.table import QUARANTINE_S, Change, RoutingTable

#: How long a request that every remaining replica refused waits before trying them again,
#: doubling with each refusal up to the cap (a replica that took a burst of loaded requests at
#: once frees its slots in a second or two; ~0.4 s of refusals was too short under load).
EXCLUDED_BACKOFF_S = 0.05
MAX_EXCLUDED_BACKOFF_S = 1.0
#: Waiters asked, in fair order, for each freed slot before it is left to newcomers.
HANDOFF_TRIES = 8
#: The bound on all waiters together, in multiples of the per-model bound: each waiter holds its
#: body in memory, and many flooded models must not take the router down.
QUEUED_TOTAL_FACTOR = 10


@dataclass(eq=False, slots=True)
class Lease:
    """One request's claim on a replica; :meth:`release` exactly once."""

    started: RequestStarted
    kind: Kind
    _table: RoutingTable
    _clock: Callable[[], float]
    _released: bool = False

    @property
    def replica(self) -> Replica:
        return self.started.replica

    @property
    def model(self) -> str:
        return self.started.model

    def release(self, ok: bool) -> None:
        """Free the slot; ``ok`` means the replica answered successfully (so it holds the model)."""
        if not self._released:
            self._released = True
            self._table.apply(RequestFinished(self.started, ok), self._clock())


@dataclass(eq=False, slots=True)
class _Waiter:
    model: str
    start: float
    exclude: set[str] | None
    future: asyncio.Future[Lease]
    retry_at: float = float("-inf")  # the replicas in ``exclude`` are not tried again before


def excluded_backoff(refusals: int) -> float:
    """The wait before a request tries again the replicas that refused it ``refusals`` times."""
    return min(EXCLUDED_BACKOFF_S * 2 ** max(0, refusals - 1), MAX_EXCLUDED_BACKOFF_S)


class Scheduler:
    """Hands out :class:`Lease` s on the replicas of its routing table (:attr:`table`).

    The scheduler makes the table and gives it the notifier it calls after each change
    (:meth:`_on_change`): the scheduler owns its wake-up, and nobody else can set it.
    ``lag_s`` and ``quarantine_s`` are the table's (see :class:`RoutingTable`).
    """

    def __init__(
        self,
        params: Params,
        *,
        lag_s: float = 0.0,
        quarantine_s: float = QUARANTINE_S,
        policy: str = DEFAULT_POLICY,
        queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
        max_queued: int = 1000,
        max_queued_requests: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        deployment: str = "",
        hold_at_zero_s: float | None = None,
        weight: Callable[[str], float] = lambda model: 1.0,
        fair: bool = True,
    ):
        #: The waiters, by model, in weighted fair order (``fair=False``: first come, first served).
        self._line: FairLine[_Waiter] = FairLine(weight, fair=fair)
        self.table = RoutingTable(lag_s=lag_s, quarantine_s=quarantine_s, notify=self._on_change)
        self.params = params
        self.policy_name = policy
        self._choose = POLICIES[policy]
        self.queue_timeout_s = queue_timeout_s
        #: The bound for a request that found no replica ready (None: ``queue_timeout_s``).
        self.hold_at_zero_s = queue_timeout_s if hold_at_zero_s is None else max(hold_at_zero_s, queue_timeout_s)
        #: Requests per model (first attempts only), for the load report.
        self.demand = RequestRates()
        self.max_queued = max_queued
        #: Ray's ``max_queued_requests``: waiters of all models before a new request is refused.
        self.max_queued_requests = max_queued_requests
        self.clock = clock
        self.rng = rng or random.Random()
        self.deployment = deployment
        self.queued = 0

    def waiting(self) -> list[tuple[str, int]]:
        """The models with requests waiting now, and how many (for metrics)."""
        return list(self._line.models())

    def try_acquire(self, model: str, waited_s: float = 0.0, exclude: Collection[str] = ()) -> Lease | None:
        """One routing decision now: a lease, or ``None`` to wait (every candidate full, or none ready)."""
        now = self.clock()
        usable = self.table.pool(now, exclude)  # indexed: the policy reads holders, not every replica
        if not usable:
            return None
        decision: Decision | None = self._choose(usable, model, self.params, waited_s=waited_s, rng=self.rng)
        if decision is None:
            return None
        started = RequestStarted.to(cast(Replica, decision.replica), model)  # the policy picks among ``usable``
        self.table.apply(started, now)
        return Lease(started, decision.kind, self.table, self.clock)

    async def acquire(self, model: str, exclude: set[str] | None = None, *, since: float | None = None,
                      refusals: int = 0) -> Lease:
        """A lease for a request for ``model``, waiting (bounded) while every candidate is full.

        ``exclude``: replicas this request already tried (a 503 or a failure); when they are
        all that is left, they are allowed again after a wait, since a full replica frees up. ``since``: when the request started waiting (its first attempt), so that
        retries share one bound and one matching timeout. ``refusals``: how many times it was
        refused so far (the wait before trying refusing replicas again doubles with each).
        """
        start = self.clock() if since is None else since
        if model and not exclude:
            self.demand.record(model, self.clock())
        lease = self.try_acquire(model, self.clock() - start, exclude or ())
        if lease is not None:
            return lease
        if self.max_queued_requests is not None and not exclude and self.queued >= self.max_queued_requests:
            # A retry (``exclude``) was admitted already: Ray bounds new requests only.
            raise BackPressureError(num_queued_requests=self.queued, max_queued_requests=self.max_queued_requests)
        if self._line.waiting(model) >= self.max_queued:
            raise Overloaded(f"{self.max_queued} requests for model {model!r} already wait for a replica of "
                             f"{self.deployment!r}")
        if self.queued >= self.max_queued * QUEUED_TOTAL_FACTOR:
            raise Overloaded(f"{self.queued} requests already wait for a replica of {self.deployment!r}")
        deadline = start + self.queue_timeout_s
        held_at_zero = False
        match_at = start + self.params.matching_timeout_s
        waiter = _Waiter(model, start, exclude, asyncio.get_running_loop().create_future(),
                         retry_at=self.clock() + excluded_backoff(refusals) if exclude else float("-inf"))
        self._line.add(model, waiter)
        self.queued += 1
        try:
            while True:
                now = self.clock()
                if not held_at_zero and not self.table.usable(now):
                    # No replica at all (scaled to zero, or all starting): wait for one to start.
                    held_at_zero = True
                    deadline = start + self.hold_at_zero_s
                if now >= deadline:
                    raise self._gave_up(now, deadline - start, refusals)
                # Wake at the matching timeout too: the policy may then place the request elsewhere.
                wake = deadline if now >= match_at else min(deadline, match_at)
                if exclude and now < waiter.retry_at:
                    # Replicas that refused this request (503) may free up without this
                    # router noticing (other routers' traffic): look again then.
                    wake = min(wake, waiter.retry_at)
                # A replica whose quarantine runs out is back without any news: look again then.
                wake = min(wake, self.table.quarantine_ends(now))
                await asyncio.wait((waiter.future,), timeout=wake - now)
                if waiter.future.done():
                    return waiter.future.result()  # handed a lease
                lease = self._try_for(waiter, self.clock())
                if lease is not None:
                    self._line.served(model)
                    return lease
        except BaseException:
            future = waiter.future
            if future.done() and not future.cancelled():
                if future.exception() is None:
                    future.result().release(ok=False)  # handed a slot it will not use: pass it on
            raise
        finally:
            if not waiter.future.done():
                waiter.future.cancel()
            self._line.remove(model, waiter)
            self.queued -= 1

    def _gave_up(self, now: float, waited_s: float, refusals: int) -> Overloaded | NotReady:
        if not self.table.usable(now):
            return NotReady(f"no replica of deployment {self.deployment!r} became ready within "
                            f"{waited_s:g} s", retry_after=1.0)
        if refusals:
            return Overloaded(f"the replicas of {self.deployment!r} refused the request as full "
                              f"({refusals} times) for {waited_s:g} s")
        return Overloaded(f"every replica of {self.deployment!r} stayed at maxOngoingRequests="
                          f"{self.params.max_ongoing} for {waited_s:g} s")

    def _try_for(self, waiter: _Waiter, now: float) -> Lease | None:
        lease = self.try_acquire(waiter.model, now - waiter.start, waiter.exclude or ())
        if (lease is None and waiter.exclude and now >= waiter.retry_at
                and self._only_excluded_left(waiter.exclude)):
            waiter.exclude.clear()
            lease = self.try_acquire(waiter.model, now - waiter.start)
        return lease

    def _on_change(self, change: Change) -> None:
        """The table's notifier: hand what changed to the waiters. The table calls it after a
        write, never from a read, and handing off writes nothing it notifies of (a started
        request frees nothing), so this is never re-entered."""
        if self._line:
            self._hand_off(HANDOFF_TRIES if change is Change.FREED else None)

    def _hand_off(self, limit: int | None) -> None:
        """Give free slots to waiters, models in fair order and each model's oldest first; ask
        at most ``limit`` waiters that cannot use one."""
        line = self._line
        now = self.clock()
        tried = 0
        # Models whose oldest waiter found no place: their younger waiters cannot either, so a
        # long line for one stuck model (a load that hangs) costs one try, and the waiters
        # of other models still get the slot (the order stays work-conserving).
        blocked: set[str] = set()
        while self.table.has_room(now, self.params.max_ongoing):
            served = False
            for model in line.order():
                for waiter in line.waiters(model):
                    if waiter.future.done():
                        continue  # leaving: its own ``finally`` takes it out of the line
                    if not waiter.exclude and model in blocked:
                        continue  # its model is blocked: only retries that exclude replicas may fit elsewhere
                    lease = self._try_for(waiter, now)
                    if lease is not None:
                        waiter.future.set_result(lease)
                        line.remove(model, waiter)
                        line.served(model)
                        served = True
                        break
                    tried += 1
                    if limit is not None and tried >= limit:
                        return
                    if not waiter.exclude:
                        blocked.add(model)
                if served:
                    break  # the order changed: the served model moved back
            if not served:
                return

    def _only_excluded_left(self, exclude: set[str]) -> bool:
        return all(r.name in exclude for r in self.table.usable(self.clock()))
