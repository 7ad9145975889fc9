"""Turning the policy's answers into leases on replicas: waiting, bounds, bookkeeping.

:meth:`Scheduler.acquire` asks the policy for a replica; when the answer is "wait", it waits
for the table to change (a slot freed, a load finished, a replica came up), at most until the
matching timeout or the queue bound, then asks again. Past the bound the request is refused
with 503 and Retry-After rather than queued for ever.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Collection

from modelplex.errors import NotReady, Overloaded
from modelplex_router.policy import POLICIES, Decision, Kind, Params
from modelplex_router.table import Replica, RoutingTable

#: How long a request that every remaining replica refused waits before trying them again.
EXCLUDED_BACKOFF_S = 0.05


@dataclass(eq=False, slots=True)
class Lease:
    """One request's claim on a replica; :meth:`release` exactly once."""

    replica: Replica
    model: str
    kind: Kind
    marked_load: bool
    _table: RoutingTable
    _clock: Callable[[], float]
    _released: bool = False

    def release(self, ok: bool) -> None:
        """Free the slot; ``ok`` means the replica answered successfully (so it holds the model)."""
        if not self._released:
            self._released = True
            self._table.finished(self.replica, self.model, self.marked_load, ok, self._clock())


class Scheduler:
    """Hands out :class:`Lease` s on the replicas of one routing table."""

    def __init__(
        self,
        table: RoutingTable,
        params: Params,
        *,
        policy: str = "cache-aware",
        queue_timeout_s: float = 10.0,
        max_queued: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        deployment: str = "",
    ):
        self.table = table
        self.params = params
        self.policy_name = policy
        self._choose = POLICIES[policy]
        self.queue_timeout_s = queue_timeout_s
        self.max_queued = max_queued
        self.clock = clock
        self.rng = rng or random.Random()
        self.deployment = deployment
        self.queued = 0

    def try_acquire(self, model: str, waited_s: float = 0.0, exclude: Collection[str] = ()) -> Lease | None:
        """One routing decision now: a lease, or ``None`` to wait. Raises NotReady when no replica is."""
        now = self.clock()
        usable = self.table.usable(now)
        if not usable:
            raise NotReady(f"no replica of deployment {self.deployment!r} is ready", retry_after=1.0)
        if exclude:
            usable = [r for r in usable if r.name not in exclude]
            if not usable:
                return None
        decision: Decision | None = self._choose(usable, model, self.params, waited_s=waited_s, rng=self.rng)
        if decision is None:
            return None
        replica = decision.replica
        marked = self.table.dispatched(replica, model)
        return Lease(replica, model, decision.kind, marked, self.table, self.clock)

    async def acquire(self, model: str, exclude: set[str] | None = None, *, since: float | None = None) -> Lease:
        """A lease for a request for ``model``, waiting (bounded) while every candidate is full.

        ``exclude``: replicas this request already tried (a 503 or a failure); when they are
        all that is left, they are allowed again after a short wait, since a full replica
        frees up. ``since``: when the request started waiting (its first attempt), so that
        retries share one bound and one matching timeout.
        """
        start = self.clock() if since is None else since
        lease = self.try_acquire(model, self.clock() - start, exclude or ())
        if lease is not None:
            return lease
        if self.queued >= self.max_queued:
            raise Overloaded(f"{self.queued} requests already wait for a replica of {self.deployment!r}")
        deadline = start + self.queue_timeout_s
        match_at = start + self.params.matching_timeout_s
        self.queued += 1
        try:
            while True:
                now = self.clock()
                if now >= deadline:
                    raise Overloaded(
                        f"every replica of {self.deployment!r} stayed at maxOngoingRequests="
                        f"{self.params.max_ongoing} for {self.queue_timeout_s:g} s"
                    )
                # Wake at the matching timeout too: the policy may then place the request elsewhere.
                wake = deadline if now >= match_at else min(deadline, match_at)
                if exclude:
                    # Replicas that refused this request (503) may free up without this
                    # router noticing (other routers' traffic): look again soon.
                    wake = min(wake, now + EXCLUDED_BACKOFF_S)
                await self.table.wait_changed(wake - now)
                lease = self.try_acquire(model, self.clock() - start, exclude or ())
                if lease is None and exclude and self._only_excluded_left(exclude):
                    exclude.clear()
                    lease = self.try_acquire(model, self.clock() - start)
                if lease is not None:
                    return lease
        finally:
            self.queued -= 1

    def _only_excluded_left(self, exclude: set[str]) -> bool:
        return all(r.name in exclude for r in self.table.usable(self.clock()))
