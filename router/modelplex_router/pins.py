"""The router's placer of pinned copies (``spec.models`` ``minCopies``).

Each router of a deployment computes the same placement (:func:`modelplex.wire.pins.place_pins`)
over the replicas it sees ready, and leases each replica's share with ``POST /v1/pins``; the
replica loads what it does not hold. It renews every :data:`~modelplex.wire.pins.RENEW_EVERY_S`
seconds and at once when the ready replicas (or their capacities) change, so a new or
replacement replica gets its copies without waiting for a request. A placement that cannot fit
(more copies than replicas, or than model slots) is logged once per change; the operator shows
it in the ``ModelsPinned`` condition.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping

import aiohttp

from modelplex.wire.pins import LEASE_S, PINS_PATH, RENEW_EVERY_S, PinRequest, Placement, place_pins, shortfall_message
from modelplex_router.table import RoutingTable

log = logging.getLogger("modelplex.router.pins")

#: How often the placer looks at the table for a change of the ready replicas.
CHECK_EVERY_S = 0.5
PIN_TIMEOUT_S = 5.0


@dataclass(eq=False)
class Pinner:
    """Keeps ``pinned`` (id -> copies) placed and leased on the ready replicas of ``table``;
    ``session`` gives the router's client session (it sends the internal credential)."""

    pinned: Mapping[str, int]
    table: RoutingTable
    session: Callable[[], aiohttp.ClientSession]
    clock: Callable[[], float]
    renew_every_s: float = RENEW_EVERY_S
    lease_s: float = LEASE_S
    check_every_s: float = CHECK_EVERY_S
    #: The latest placement (for ``/v1/replicas`` and the tests).
    placement: Placement = field(default_factory=Placement)
    _shown_missing: dict[str, int] = field(default_factory=dict)

    def ready(self) -> dict[str, tuple[str, int]]:
        """The ready replicas: name -> (url, model capacity; 0 while unknown)."""
        return {r.name: (r.url, r.capacity) for r in self.table.replicas() if r.ready and r.url}

    async def run(self) -> None:
        """Place and renew until cancelled."""
        seen: dict[str, tuple[str, int]] | None = None
        renewed_at = float("-inf")
        while True:
            ready = self.ready()
            now = self.clock()
            if ready != seen or now - renewed_at >= self.renew_every_s:
                seen = ready if await self.renew(ready) else None  # a failed push retries at the next check
                renewed_at = now
            await asyncio.sleep(self.check_every_s)

    async def renew(self, ready: Mapping[str, tuple[str, int]]) -> bool:
        """Place over ``ready`` and lease each replica's share; whether every replica took it."""
        self.placement = placement = place_pins(self.pinned, {name: cap for name, (_, cap) in ready.items()})
        if placement.missing != self._shown_missing:
            self._shown_missing = dict(placement.missing)
            if placement.missing:
                log.warning("pinned models do not fit: %s", shortfall_message(self.pinned, placement.missing, len(ready)))
            else:
                log.info("every pinned copy is placed (%d replica(s))", len(ready))
        pushes = [self._lease(name, ready[name][0], models) for name, models in placement.replicas.items() if models]
        return all(await asyncio.gather(*pushes))

    async def _lease(self, name: str, url: str, models: tuple[str, ...]) -> bool:
        body = PinRequest(models, self.lease_s).to_dict()
        try:
            async with self.session().post(url.rstrip("/") + PINS_PATH, json=body,
                                            timeout=aiohttp.ClientTimeout(total=PIN_TIMEOUT_S)) as answer:
                if answer.status != 200:
                    log.warning("replica %s refused its pins %s: HTTP %d %s", name, ", ".join(models), answer.status,
                                (await answer.text())[:300])
                    return False
                return True
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            log.warning("pinning %s on replica %s failed: %s", ", ".join(models), name, error or type(error).__name__)
            return False
