"""Experiments on Modelplex without changing its code (``run.py --mpx-experiment``,
``profile_modelplex.py --uvloop``): this folder goes first on the replicas' and the router's
PYTHONPATH only then, and Python imports this module at start-up.

- ``BENCH_UVLOOP=1``: the asyncio event loop policy is uvloop's.
- ``BENCH_GC_LOG=DIR``: the process counts its garbage collector's collections and CPU time
  (``time.thread_time`` in ``gc.callbacks``) per generation, and twice a second rewrites the
  totals to ``DIR/gc.PID`` (``profile_modelplex.py --gc`` reads them).

The cache policies once tried here (lfu, eviction after the load, bounded loads) are the
model cache's own options now: ``spec.multiplexing.evictionPolicy`` and
``maxConcurrentLoads`` (``cache_policies.py`` runs them).
"""

import os

if os.environ.get("BENCH_UVLOOP") == "1":
    import asyncio

    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

if os.environ.get("BENCH_GC_LOG"):
    import gc
    import threading
    import time
    from pathlib import Path

    _totals = [[0, 0.0] for _ in range(3)]  # per generation: collections, CPU seconds
    _began = [0.0]

    def _count(phase: str, info: dict) -> None:
        if phase == "start":
            _began[0] = time.thread_time()
        else:
            total = _totals[info["generation"]]
            total[0] += 1
            total[1] += time.thread_time() - _began[0]

    def _write(path: Path) -> None:
        while True:
            path.write_text(" ".join(f"{count} {seconds:.6f}" for count, seconds in _totals) + "\n")
            time.sleep(0.5)

    gc.callbacks.append(_count)
    threading.Thread(target=_write, args=(Path(os.environ["BENCH_GC_LOG"]) / f"gc.{os.getpid()}",), daemon=True,
                     name="bench-gc-log").start()
