"""The routing policy of DESIGN.md, as pure functions over replica views.

Nothing here does I/O, reads a clock or keeps state: the caller passes the replicas it may
use, how long the request has waited, and a random source, and gets a :class:`Decision` back
(or ``None``: "wait for a slot to free up, then ask again"). That keeps every tier testable
with plain objects and a fake clock.

For a request naming model M, among the ready replicas:

1. *holders* of M (loaded, or being loaded because of a request this router sent) with room:
   the less busy of two picked at random (power of two choices). Room for a request whose
   model is still loading there is room in that model's own queue (``maxOngoingRequests``
   waiters), not a slot: waiting for a load takes none of the slots loaded models need, so a
   load that hangs holds up only its own model's requests;
2. when no replica holds M, the replica with the fewest models, ties broken by rendezvous
   hashing on (M, replica name) so that several routers place a new model on the same
   replica; when every holder is full, M *spreads* to one more replica the same way rather
   than queueing behind the holders (the hot-model spread: ray-project/ray#48741), if one
   has capacity to spare (at most half its slots taken) and no holder is still loading M;
   otherwise the request waits for a holder's slot, up to ``matching_timeout_s``, and then
   goes to any replica with room; a model at its ``maxCopies`` holders never spreads further
   and waits for a holder's slot. While M is only loading (no holder has it yet), its
   requests wait for that load: a load that hangs is not started on every replica in turn;
3. otherwise any replica with room (the least busy).

Tiers 2 and 3 look at a bounded sample (:data:`SAMPLE` replicas with room, taken in the order
of a hash ring from M's point, fewest models first), not at every replica: with the routing
table's index (:class:`Pool`) a decision costs O(holders + sample), whatever the pool's size,
and stays the same on every router that sees the same pool.

A request with no model id goes to the least busy replica.
"""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import random
from dataclasses import dataclass
from typing import Generic, Iterable, Iterator, Protocol, Sequence, TypeVar

from modelplex.wire.spec import DEFAULT_MATCHING_TIMEOUT_S


class Kind(enum.Enum):
    """Why a replica was picked; the router counts these as cache hits, misses, fallbacks."""

    HIT = "hit"  # the replica holds M (loaded, or loading it already)
    MISS = "miss"  # no replica held M: this one will load it
    FALLBACK = "fallback"  # holders of M exist but were full: M goes to one more replica
    ANY = "any"  # the request named no model


class ReplicaView(Protocol):
    """What the policy reads of a replica (see :class:`modelplex_router.record.Replica`)."""

    @property
    def name(self) -> str:
        """The replica's name (stable: the hash ring and rendezvous hashing use it)."""

    @property
    def inflight(self) -> int:
        """Requests in its slots now."""

    def holds(self, model: str) -> bool:
        """M is loaded there, or is being loaded there."""

    def is_loading(self, model: str) -> bool:
        """M is being loaded there and is not loaded yet."""

    def waiting(self, model: str) -> int:
        """Requests for M this router sent there while M was not loaded (they wait for its load)."""

    @property
    def model_count(self) -> int:
        """Models loaded or loading there, at most the replica's capacity."""


#: A replica of whatever shape the caller keeps (the router's table records); a decision hands
#: back the caller's own record, not a bare view of it.
R = TypeVar("R", bound=ReplicaView)

#: The random source when the caller passes none (one per process, as the ``random`` module's).
_RNG = random.Random()


class CopyLimits(Protocol):
    """How many replicas a model may spread to (``spec.models[].maxCopies``)."""

    def max_copies(self, model: str) -> int | None:
        """The bound for ``model``; None: no bound."""


@dataclass(frozen=True, slots=True)
class Params:
    """The knobs of the policy; from the spec (``maxOngoingRequests``, ``matchingTimeoutSeconds``,
    ``models[].maxCopies``)."""

    max_ongoing: int
    matching_timeout_s: float = DEFAULT_MATCHING_TIMEOUT_S
    hot_spread: bool = True
    limits: CopyLimits | None = None


@dataclass(frozen=True, slots=True)
class Decision(Generic[R]):
    replica: R
    kind: Kind


class Policy(Protocol):
    """What :data:`POLICIES` holds: a choice among ``replicas`` for a request for ``model``."""

    def __call__(self, replicas: Sequence[R] | Pool[R], model: str, params: Params, *, waited_s: float = 0.0,
                 rng: random.Random | None = None) -> Decision[R] | None: ...


#: How many replicas a new model's place is chosen among at most (tiers 2 and 3): enough that
#: the rendezvous choice spreads models well, few enough that a miss costs microseconds.
SAMPLE = 8


def ring_point(text: str) -> int:
    """Where ``text`` (a replica's name, a model id) sits on a hash ring: the same on every
    router and run (Python's ``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Pool(Generic[R]):
    """The usable replicas as the policy reads them: a model's holders, and the non-holders by
    number of models. :class:`ListPool` derives both from a list on each call; the routing table
    keeps them indexed (``RoutingTable.pool``)."""

    def everyone(self) -> Sequence[R]:
        """Every usable replica (for a request that names no model)."""
        raise NotImplementedError

    def holders(self, model: str) -> Sequence[R]:
        """The usable replicas holding ``model`` (loaded or loading)."""
        raise NotImplementedError

    def tiers(self, model: str) -> Iterator[Iterable[R]]:
        """The usable replicas grouped by model count, fewest first, each group in the order of
        the hash ring from ``model``'s point (:func:`ring_point`). Holders may be among them."""
        raise NotImplementedError


class ListPool(Pool[R]):
    """A :class:`Pool` over a plain list of usable replicas (tests, benchmarks, few replicas)."""

    def __init__(self, replicas: Sequence[R]):
        self._replicas = replicas

    def everyone(self) -> Sequence[R]:
        return self._replicas

    def holders(self, model: str) -> Sequence[R]:
        return [r for r in self._replicas if r.holds(model)]

    def tiers(self, model: str) -> Iterator[Iterable[R]]:
        by_count: dict[int, list[tuple[int, str, R]]] = {}
        for replica in self._replicas:
            by_count.setdefault(replica.model_count, []).append((_name_point(replica.name), replica.name, replica))
        point = ring_point(model)
        for count in sorted(by_count):
            ring = sorted(by_count[count], key=lambda entry: entry[:2])
            start = bisect.bisect_left(ring, point, key=lambda entry: entry[0])
            yield [entry[2] for entry in ring[start:] + ring[:start]]


@functools.lru_cache(maxsize=4096)
def _name_point(name: str) -> int:
    return ring_point(name)


def choose(
    replicas: Sequence[R] | Pool[R],
    model: str,
    params: Params,
    *,
    waited_s: float = 0.0,
    rng: random.Random | None = None,
) -> Decision[R] | None:
    """Pick a replica for a request for ``model`` ("" for none) among ``replicas`` (all ready).

    ``replicas`` is a plain sequence or a :class:`Pool` that keeps an index (the routing
    table's): then a model's holders are read from the index and a new model's place is chosen
    among a bounded sample, so a decision costs O(holders + :data:`SAMPLE`), not O(replicas).
    ``waited_s`` is how long the request has waited for a slot so far. ``None`` means no
    replica may take it now: wait for a change (a slot freed, a load done) and call again.
    """
    rng = rng or _RNG
    pool = replicas if isinstance(replicas, Pool) else ListPool(replicas)
    limit = params.max_ongoing
    if not model:
        replica = least_busy(pool.everyone(), limit, rng)
        return Decision(replica, Kind.ANY) if replica is not None else None

    holders = pool.holders(model)
    spare: int | None = None
    if holders:
        with_room = [r for r in holders if has_room(r, model, limit)]
        if with_room:
            return Decision(two_choices(with_room, rng), Kind.HIT)
        if all(r.is_loading(model) for r in holders):
            return None  # M's own queue is full: wait for its load, whatever it takes
        bound = params.limits.max_copies(model) if params.limits is not None else None
        if bound is not None and len(holders) >= bound:
            return None  # at its maxCopies: wait for a holder's slot, past the matching timeout too
        # Every holder is full. Spread M to one more replica now (hot-model spread), but not
        # while a holder is still loading it (a burst for a new model must not load it
        # everywhere), and only to a replica with capacity to spare (when every replica is
        # busy, moving M around adds loads, not capacity). Past the matching timeout the
        # request stops waiting and goes to any replica with room, as in Ray Serve.
        if waited_s < params.matching_timeout_s:
            if not params.hot_spread or any(r.is_loading(model) for r in holders):
                return None
            spare = limit // 2
        kind = Kind.FALLBACK
    else:
        kind = Kind.MISS

    target = place(pool, model, limit, spare=spare)
    if target is None:
        target = least_busy(spill(pool, model, limit, spare), limit, rng)
    return Decision(target, kind) if target is not None else None


def has_room(replica: ReplicaView, model: str, limit: int) -> bool:
    """A holder of ``model`` can take a request for it now: a slot, or a place in the queue of
    the model's load."""
    if replica.is_loading(model):
        return replica.waiting(model) < limit
    return replica.inflight < limit


def _candidates(tier: Iterable[R], model: str, limit: int, spare: int | None,
                room: list[R], count: int) -> bool:
    """Append to ``room`` (up to ``count`` in all) the replicas of ``tier``, in its order, that
    may take ``model`` and have a slot; whether the tier had any that may take it (full or not)."""
    seen = False
    for replica in tier:
        if replica.holds(model) or (spare is not None and replica.inflight > spare):
            continue
        seen = True
        if replica.inflight < limit:
            room.append(replica)
            if len(room) >= count:
                break
    return seen


def place(replicas: Sequence[R] | Pool[R], model: str, limit: int, *, spare: int | None = None) -> R | None:
    """Tier 2: of the non-holders with the fewest models, the one ``model`` hashes to (with room).

    The candidates are at most :data:`SAMPLE` replicas of that tier with room: the first ones
    after ``model``'s point on the tier's hash ring, so that every router seeing the same pool
    samples the same ones; rendezvous hashing picks among them. While a tier has no more than
    :data:`SAMPLE` replicas with room, that is every one of them. ``spare``: only replicas with
    at most that many requests in flight count (the hot-model spread). ``None`` when every
    replica with the fewest models is full (the caller falls to tier 3, :func:`spill`).
    """
    pool = replicas if isinstance(replicas, Pool) else ListPool(replicas)
    for tier in pool.tiers(model):
        room: list[R] = []
        if _candidates(tier, model, limit, spare, room, SAMPLE):
            return max(room, key=lambda r: rendezvous_score(model, r.name)) if room else None
    return None


def spill(pool: Pool[R], model: str, limit: int, spare: int | None = None) -> list[R]:
    """Tier 3's candidates: up to :data:`SAMPLE` non-holders with room, fewest models first."""
    room: list[R] = []
    for tier in pool.tiers(model):
        _candidates(tier, model, limit, spare, room, SAMPLE)
        if len(room) >= SAMPLE:
            break
    return room


def rendezvous_score(model: str, replica_name: str) -> bytes:
    """A stable, well-spread score of (model, replica): the same on every router and run.

    Python's ``hash()`` is salted per process, so routers would disagree; blake2b is not.
    """
    return hashlib.blake2b(f"{model}\0{replica_name}".encode(), digest_size=8).digest()


def two_choices(replicas: Sequence[R], rng: random.Random) -> R:
    """Power of two choices: the less busy of two distinct replicas drawn at random."""
    n = len(replicas)
    if n == 1:
        return replicas[0]
    i = rng.randrange(n)
    j = rng.randrange(n - 1)
    if j >= i:
        j += 1
    a, b = replicas[i], replicas[j]
    return a if a.inflight <= b.inflight else b


def least_busy(replicas: Sequence[R], limit: int, rng: random.Random) -> R | None:
    """The replica with the fewest requests in flight and room for one more (ties: random)."""
    n = len(replicas)
    if n == 0:
        return None
    start = rng.randrange(n) if n > 1 else 0
    best = None
    for k in range(n):
        replica = replicas[(start + k) % n]
        if replica.inflight < limit and (best is None or replica.inflight < best.inflight):
            best = replica
    return best


def choose_random(
    replicas: Sequence[R] | Pool[R], model: str, params: Params, *, rng: random.Random | None = None, **_: object
) -> Decision[R] | None:
    """The baseline the benchmark compares against: any replica with room, uniformly."""
    rng = rng or _RNG
    everyone = replicas.everyone() if isinstance(replicas, Pool) else replicas
    with_room = [r for r in everyone if r.inflight < params.max_ongoing]
    if not with_room:
        return None
    replica = with_room[rng.randrange(len(with_room))]
    if not model:
        return Decision(replica, Kind.ANY)
    return Decision(replica, Kind.HIT if replica.holds(model) else Kind.MISS)


#: Policies by name (``MODELPLEX_ROUTING_POLICY``); "random" exists for the benchmark only.
POLICIES: dict[str, Policy] = {"cache-aware": choose, "random": choose_random}
