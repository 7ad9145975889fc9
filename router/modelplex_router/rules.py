"""What ``spec.models`` says of one model id, as the router reads it: its weight where
requests wait, what a request does when no replica holds it, how far it may spread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from modelplex.wire.spec import ModelEntry, first_matching_entry


@dataclass(frozen=True)
class ModelRules:
    """The entries of ``spec.models``; an id matching none follows the defaults."""

    entries: tuple[ModelEntry, ...] = ()

    def entry(self, model: str) -> ModelEntry:
        """The first entry matching ``model``, else the defaults (a short list: a scan is cheap)."""
        return first_matching_entry(self.entries, model)

    def weight(self, model: str) -> float:
        """``model``'s share where requests wait (weighted fair order)."""
        return self.entry(model).weight

    def on_cold(self, model: str) -> Literal["hold", "reject"]:
        """What a request for ``model`` does when no ready replica holds it."""
        return self.entry(model).on_cold

    def max_copies(self, model: str) -> int | None:
        """How many replicas ``model`` may spread to (None: no bound)."""
        return self.entry(model).max_copies
