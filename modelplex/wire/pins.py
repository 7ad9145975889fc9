"""Pinned copies (``spec.models`` ``minCopies``): where they go, and the lease a replica grants.

Every router of a deployment, and the operator before a scale-down, computes the same
placement (:func:`place_pins`) from the same inputs: the pinned ids with their ``minCopies``
and the ready replicas with their model capacity. It is rendezvous hashing with bounded
loads: each id goes to the replicas that score highest for it and still have a slot that is
not another pin's, so two routers agree without talking, and a replica that comes back under
its name gets back its copies.

The placer pins a copy with a lease on the replica's internal API, ``POST /v1/pins``
(:class:`PinRequest`): the replica never evicts a leased model and loads it if it is not
loaded. The placer renews the lease every :data:`RENEW_EVERY_S` seconds; a copy whose lease
is not renewed (the placement moved it elsewhere, the router went away) becomes an ordinary
cached model after :data:`LEASE_S` seconds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from modelplex.wire.ids import InvalidModelId, validate_model_id

#: The replica's route that pins models (internal: the namespace's credential).
PINS_PATH = "/v1/pins"
#: How long a pin lasts unless renewed.
LEASE_S = 30.0
#: How often a placer renews its pins (well within a lease: two renewals may fail in a row).
RENEW_EVERY_S = 10.0
#: The longest lease a replica grants, and the most ids one request pins.
MAX_LEASE_S = 3600.0
MAX_PINS_PER_REQUEST = 1000


@dataclass(frozen=True)
class PinRequest:
    """``POST /v1/pins``: lease ``models`` for ``ttl_s`` seconds and load those not loaded;
    with ``wait``, the answer comes once their loads are done (a scale-down's pre-warm)."""

    models: tuple[str, ...]
    ttl_s: float = LEASE_S
    wait: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"models": list(self.models), "ttlSeconds": self.ttl_s, "wait": self.wait}

    @classmethod
    def from_dict(cls, data: Any) -> PinRequest:
        """Parse a request body; :class:`ValueError` naming the field when it is wrong."""
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object with models, ttlSeconds and wait")
        models = data.get("models")
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise ValueError("models must be a list of model ids")
        if len(models) > MAX_PINS_PER_REQUEST:
            raise ValueError(f"models: at most {MAX_PINS_PER_REQUEST} ids per request (got {len(models)})")
        try:
            ids = tuple(dict.fromkeys(validate_model_id(m) for m in models))
        except InvalidModelId as error:
            raise ValueError(f"models: {error}") from None
        ttl = data.get("ttlSeconds", LEASE_S)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_LEASE_S:
            raise ValueError(f"ttlSeconds must be a number in (0, {MAX_LEASE_S:g}] (got {ttl!r})")
        wait = data.get("wait", False)
        if not isinstance(wait, bool):
            raise ValueError(f"wait must be true or false (got {wait!r})")
        return cls(ids, float(ttl), wait)


def pin_score(model: str, replica: str) -> bytes:
    """A stable, well-spread score of (model, replica), the same in every process (Python's
    ``hash()`` is salted per process)."""
    return hashlib.blake2b(f"pin\0{model}\0{replica}".encode(), digest_size=8).digest()


@dataclass(frozen=True)
class Placement:
    """Where each pinned copy goes: ``replicas`` (name -> the ids it pins, sorted) and, per id
    that does not fit, how many copies have no replica (``missing``)."""

    replicas: dict[str, tuple[str, ...]] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)

    def holders(self, model: str) -> list[str]:
        """The replicas placed to hold ``model``, by name."""
        return sorted(name for name, models in self.replicas.items() if model in models)


def place_pins(pinned: Mapping[str, int], capacities: Mapping[str, int]) -> Placement:
    """Place ``minCopies`` copies of each pinned id (``pinned``: id -> copies) on distinct
    replicas (``capacities``: name -> models it holds at most, 0 for unknown: no bound).

    Ids are placed most copies first (then by id), each on the replicas scoring highest for it
    that have a slot no other pin took; what finds no replica is ``missing``."""
    free: dict[str, float] = {name: (cap if cap > 0 else float("inf")) for name, cap in capacities.items()}
    placed: dict[str, list[str]] = {name: [] for name in capacities}
    missing: dict[str, int] = {}
    for model in sorted(pinned, key=lambda m: (-pinned[m], m)):
        wanted = pinned[model]
        ranked = sorted(free, key=lambda name: pin_score(model, name), reverse=True)
        chosen = [name for name in ranked if free[name] >= 1][:wanted]
        for name in chosen:
            free[name] -= 1
            placed[name].append(model)
        if len(chosen) < wanted:
            missing[model] = wanted - len(chosen)
    return Placement({name: tuple(sorted(models)) for name, models in placed.items()}, missing)


def shortfall_message(pinned: Mapping[str, int], missing: Mapping[str, int], replicas: int) -> str:
    """What a placement could not fit, for a log line and the ``ModelsPinned`` condition."""
    parts = [f"{model}: {pinned[model] - missing[model]}/{pinned[model]} copies placed" for model in sorted(missing)]
    return (f"{'; '.join(parts)} ({replicas} ready replica(s); each copy needs a distinct replica "
            "with a model slot no other pin takes)")
