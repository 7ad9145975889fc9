"""Offline cache hit rates of a request trace: Belady's optimal (MIN) and LRU.

A hit is a request whose model is in the cache when it arrives; every miss is a load
(compulsory misses included), so hit rate = 1 - loads / requests, as measured on the servers.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import OrderedDict


def zipf_trace(n: int, models: int, s: float, seed: int) -> list[str]:
    """``n`` requests over ``models`` ids, P(rank k) ~ 1/k^s (the router bench's trace)."""
    names = [f"model-{k:02d}" for k in range(1, models + 1)]
    weights = [1.0 / k**s for k in range(1, models + 1)]
    return random.Random(seed).choices(names, weights, k=n)


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The trace's options (``--requests``, ``--models``, ``--zipf``), with the defaults every
    tool that replays a Zipf trace shares (the cache simulation, the router bench)."""
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--zipf", type=float, default=1.1)


def belady_hits(trace: list[str], capacity: int) -> int:
    """Hits of the optimal offline policy: on a miss with a full cache, evict the model whose
    next use is farthest in the future (never used again = farthest)."""
    if capacity <= 0:
        return 0
    n = len(trace)
    next_use = [n] * n
    last: dict[str, int] = {}
    for i in range(n - 1, -1, -1):
        next_use[i] = last.get(trace[i], n + i + 1)  # unique "never" values keep the heap exact
        last[trace[i]] = i
    cache: dict[str, int] = {}  # model -> its next use
    heap: list[tuple[int, str]] = []  # (-next use, model), lazily invalidated
    hits = 0
    for i, model in enumerate(trace):
        if model in cache:
            hits += 1
        elif len(cache) >= capacity:
            while True:
                negative, victim = heapq.heappop(heap)
                if cache.get(victim) == -negative:
                    del cache[victim]
                    break
        cache[model] = next_use[i]
        heapq.heappush(heap, (-next_use[i], model))
    return hits


def lru_hits(trace: list[str], capacity: int) -> int:
    cache: OrderedDict[str, None] = OrderedDict()
    hits = 0
    for model in trace:
        if model in cache:
            hits += 1
            cache.move_to_end(model)
        else:
            cache[model] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


def _brute_belady(trace: list[str], capacity: int) -> int:
    """Exhaustive optimum over eviction choices, for tests on tiny traces."""
    from functools import lru_cache

    @lru_cache(maxsize=None)
    def best(i: int, cache: frozenset) -> int:
        if i == len(trace):
            return 0
        model = trace[i]
        if model in cache:
            return 1 + best(i + 1, cache)
        if len(cache) < capacity:
            return best(i + 1, cache | {model})
        return max(best(i + 1, (cache - {victim}) | {model}) for victim in cache)

    return best(0, frozenset())


if __name__ == "__main__":  # self-check against the exhaustive optimum
    rng = random.Random(1)
    for _ in range(300):
        t = [rng.choice("abcdef") for _ in range(rng.randint(1, 14))]
        c = rng.randint(1, 4)
        assert belady_hits(t, c) == _brute_belady(t, c), (t, c)
        assert lru_hits(t, c) <= belady_hits(t, c)
    print("belady: ok")
