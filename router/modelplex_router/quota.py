"""Cold loads per client (``spec.router.loadQuota``): a token bucket per client name (pure: the
clock is injected).

A client's bucket holds up to ``burst`` tokens and refills at ``loadsPerMinute``; each request
that would start a cold load takes one. The buckets are kept for the ``max_clients`` clients
seen most recently: a client pushed out starts again with a full bucket, which bounds the
router's memory whatever the number of callers (addresses, where auth is off).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

#: Clients whose buckets are kept (least recently seen dropped first).
MAX_CLIENTS = 10_000


class LoadQuotas:
    """Token buckets of cold loads, one per client name."""

    def __init__(self, loads_per_minute: float, burst: int, *, clock: Callable[[], float],
                 max_clients: int = MAX_CLIENTS):
        self.rate = loads_per_minute / 60.0  # tokens per second
        self.burst = float(burst)
        self.clock = clock
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, as of)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, client: str) -> float | None:
        """Take one load for ``client``: None when granted, else the seconds until one is."""
        now = self.clock()
        tokens = self._tokens(client, now)
        if tokens >= 1.0:
            self._store(client, tokens - 1.0, now)
            return None
        self._store(client, tokens, now)
        return (1.0 - tokens) / self.rate

    def _tokens(self, client: str, now: float) -> float:
        bucket = self._buckets.get(client)
        if bucket is None:
            return self.burst
        tokens, since = bucket
        return min(self.burst, tokens + max(0.0, now - since) * self.rate)

    def _store(self, client: str, tokens: float, now: float) -> None:
        self._buckets[client] = (tokens, now)
        self._buckets.move_to_end(client)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
