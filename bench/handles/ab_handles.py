"""A/B: handle calls through a real router and replica, this tree's handles against a baseline's.

    .venv/bin/python bench/handles/ab_handles.py [BASELINE_REV]   # default ae28ec5 (before typed, eager handles)

One ``modelplex local`` deployment (tests/integration/ray_parity/parity.py's Echo); both handle
modules call its ``__call__`` with a small JSON body: sequential latency and 32 concurrent callers,
5 interleaved rounds each (order alternating), medians.
"""
import asyncio
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

BASELINE = sys.argv[1] if len(sys.argv) > 1 else "ae28ec5"
baseline_file = Path(tempfile.mkdtemp()) / "baseline_handles.py"
baseline_file.write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE}:modelplex/handles.py"],
                                         check=True, capture_output=True).stdout)
spec = importlib.util.spec_from_file_location("old_handles", baseline_file)
old = importlib.util.module_from_spec(spec)
sys.modules["old_handles"] = old  # dataclasses look their module up
spec.loader.exec_module(old)

import modelplex.handles as new  # noqa: E402

from support.servers import Processes  # noqa: E402
from support.stacks import manifest, start_local, write_documents  # noqa: E402


async def sequential(h, n=400):
    t = time.perf_counter()
    for i in range(n):
        await h.remote({"i": i})
    return (time.perf_counter() - t) / n * 1e3  # ms per call


async def concurrent(h, workers=32, each=40):
    async def worker():
        for i in range(each):
            await h.remote({"i": i})
    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return workers * each / (time.perf_counter() - t)  # calls/s


async def main(url):
    hs = {f"baseline {BASELINE}": old.handle("echo", url=url), "this tree": new.handle("echo", url=url)}
    for h in hs.values():  # warm up
        await sequential(h, 50)
    res = {k: {"seq_ms": [], "c32_rps": []} for k in hs}
    for round_ in range(5):
        for k, h in (hs.items() if round_ % 2 == 0 else reversed(list(hs.items()))):
            res[k]["seq_ms"].append(await sequential(h))
            res[k]["c32_rps"].append(await concurrent(h))
    for k, r in res.items():
        print(k, "sequential ms/call median", round(statistics.median(r["seq_ms"]), 3), r["seq_ms"],
              "| c=32 calls/s median", round(statistics.median(r["c32_rps"]), 1), [round(x) for x in r["c32_rps"]])


folder = Path(tempfile.mkdtemp())
processes = Processes(folder)
try:
    shutil.copy(ROOT / "tests/integration/ray_parity/parity.py", folder / "parity.py")
    path = write_documents(folder / "b.yaml", [manifest("echo", "parity:Echo")])
    stack = start_local(processes, path, deployments=1)
    asyncio.run(main(stack.url("echo")))
finally:
    processes.stop_all()
