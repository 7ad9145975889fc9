"""Weighted fair order between the models whose requests wait for a slot (pure: no I/O, no clock).

Where requests wait for a replica slot, serving them first come, first served lets one
model's flood starve every other model: a single request for model B waits behind the 64
requests for model A that came before it. :class:`FairLine` keeps one line per model and
says which model's oldest waiter is served next, by start-time fair queueing (the
virtual-time form of deficit round robin): each model has a start tag, serving one of its
requests advances its tag by ``1 / weight``, and the model with the smallest tag goes
first. A model that starts waiting gets the tag of the request served last, so a model that
was idle does not bank credit, and a model that waits now is served within one round.

The order is work-conserving: it only orders the models that have waiters; a model alone is
served every time, whatever its weight. With ``fair=False`` the order is first come, first
served across models (the benchmark's baseline).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, Iterator, TypeVar

T = TypeVar("T", bound=Hashable)

#: The queue orders a router may use (``MODELPLEX_ROUTING_QUEUE_ORDER``).
ORDERS = ("fair", "fifo")


@dataclass(slots=True)
class _ModelLine(Generic[T]):
    start: float  # the start tag of this model's next request
    waiters: dict[T, int] = field(default_factory=dict)  # arrival order, each with its sequence number


class FairLine(Generic[T]):
    """Waiters grouped by model, handed out in weighted fair order.

    ``weight(model)`` is the model's share (``spec.models[].weight``, default 1): a model with
    weight 2 is served twice as often as one with weight 1 while both wait. Waiters are any
    hashable objects; a model's line is dropped when its last waiter leaves, so the state is
    bounded by the waiters themselves.
    """

    def __init__(self, weight: Callable[[str], float] = lambda model: 1.0, *, fair: bool = True):
        self._weight = weight
        self.fair = fair
        self._lines: dict[str, _ModelLine[T]] = {}
        self._seq = itertools.count()
        self._virtual = 0.0  # the start tag of the request served last
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def waiting(self, model: str) -> int:
        """How many requests for ``model`` wait now."""
        line = self._lines.get(model)
        return len(line.waiters) if line else 0

    def models(self) -> Iterator[tuple[str, int]]:
        """Every model with waiters, and how many (for metrics)."""
        for model, line in self._lines.items():
            yield model, len(line.waiters)

    def add(self, model: str, waiter: T) -> None:
        """``waiter`` starts waiting for a slot for ``model`` (behind that model's earlier waiters)."""
        line = self._lines.get(model)
        if line is None:
            line = self._lines[model] = _ModelLine(self._virtual)
        line.waiters[waiter] = next(self._seq)
        self._count += 1

    def remove(self, model: str, waiter: T) -> None:
        """``waiter`` stops waiting (served, timed out or gone); unknown waiters are ignored."""
        line = self._lines.get(model)
        if line is None or line.waiters.pop(waiter, None) is None:
            return
        self._count -= 1
        if not line.waiters:
            del self._lines[model]

    def served(self, model: str) -> None:
        """One request for ``model`` got a slot: charge its model (``1 / weight``).

        A model with no waiters is not charged (a request that found a free slot at once)."""
        line = self._lines.get(model)
        if line is None:
            return
        self._virtual = max(self._virtual, line.start)
        line.start += 1.0 / self._weight(model)

    def order(self) -> list[str]:
        """The models with waiters, the one to serve next first."""
        lines = self._lines
        if self.fair:
            return sorted(lines, key=lambda m: (lines[m].start, next(iter(lines[m].waiters.values()))))
        return sorted(lines, key=lambda m: next(iter(lines[m].waiters.values())))

    def waiters(self, model: str) -> list[T]:
        """``model``'s waiters, oldest first (a copy: the caller may remove them while walking it)."""
        line = self._lines.get(model)
        return list(line.waiters) if line else []
