"""Experiments on Modelplex without changing its code (``run.py --mpx-experiment``,
``profile_modelplex.py --uvloop``): this folder goes first on the replicas' and the router's
PYTHONPATH only then, and Python imports this module at start-up.

- ``BENCH_UVLOOP=1``: the asyncio event loop policy is uvloop's.

The cache policies once tried here (lfu, eviction after the load, bounded loads) are the
model cache's own options now: ``spec.multiplexing.evictionPolicy`` and
``maxConcurrentLoads`` (``cache_policies.py`` runs them).
"""

import os

if os.environ.get("BENCH_UVLOOP") == "1":
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
