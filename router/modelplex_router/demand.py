"""How often each model is requested: the request rates the load report carries."""

from __future__ import annotations

import math
from collections import Counter, deque

from modelplex.wire.load import RATE_WINDOW_S


class RequestRates:
    """Requests per model over a sliding window, in one-second buckets (so memory is bounded by
    the window's seconds times the models requested in it, whatever the request rate)."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._buckets: deque[tuple[int, Counter[str]]] = deque()

    def record(self, model: str, now: float) -> None:
        second = math.floor(now)
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append((second, Counter()))
            self._forget(now)
        self._buckets[-1][1][model] += 1

    def rates(self, now: float) -> dict[str, float]:
        """Requests per second for each model requested within the window."""
        self._forget(now)
        total: Counter[str] = Counter()
        for _, counts in self._buckets:
            total.update(counts)
        return {model: count / self.window_s for model, count in total.items()}

    def _forget(self, now: float) -> None:
        oldest = math.floor(now - self.window_s) + 1
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()
