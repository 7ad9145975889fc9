"""The benchmark's model classes, written once against an ``sdk`` object.

``sdk`` is either ``ray.serve`` or ``modelplex``: both offer ``multiplexed``, ``batch`` and
``get_multiplexed_model_id`` with the same signatures, so :func:`build` gives the very same
handler code to both systems. ``mp_handlers`` builds them with ``modelplex`` (the replica
imports them from the manifest's ``handler:``); ``ray_app`` builds them with ``ray.serve`` and
adds the thin HTTP adapter Ray needs (a starlette ``Request`` in, a ``Response`` out).

Every class takes its settings from the environment (``BENCH_*``), which both systems give to
their replicas (Modelplex: the replica processes inherit it; Ray: the adapter applies the
settings it was bound with before the class is built).

Handlers get the request body as parsed JSON and return a JSON-able value (or, streaming,
yield JSON-able chunks).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from types import SimpleNamespace

# Workload 1: the MLP and its batching settings (the same decorator arguments on both systems).
MLP_SIZES = (512, 2048, 2048, 512)
GPU_MLP_SIZES = (1024, 8192, 8192, 1024)
BATCH_MAX = 32
BATCH_WAIT_S = 0.002
GPU_BATCH_MAX = 256
GPU_BATCH_WAIT_S = 0.005
# Workload 2: many small MLPs, built from the model id's seed after a simulated fetch.
MUX_SLOTS = 4
MUX_SIZES = (256, 1024, 256)
# Workload 3: streams.
STREAM_CHUNKS = 20
# Workload 4, busy replicas: user code that computes on its event loop, as users write it.
BUSY_ROWS = 48
BUSY_CHUNKS = 20


#: Run the batched MLP's forward pass in a worker thread instead of on the event loop.
_OFFLOAD = os.environ.get("BENCH_OFFLOAD") == "1"


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def make_mlp(sizes, seed: int, device: str = "cpu"):
    """A ReLU MLP with weights drawn from ``seed`` (real construction, no file)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layer = torch.nn.Linear(a, b)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(b, a, generator=generator) * (1.0 / a) ** 0.5)
            layer.bias.zero_()
        layers += [layer, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).eval().to(device)


def model_seed(model_id: str) -> int:
    return int.from_bytes(hashlib.sha256(model_id.encode()).digest()[:4], "little")


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)  # one intra-op thread per replica, on both systems


def _torch_handler(handler, sizes=None, device: str = "cpu") -> None:
    """What every torch handler does first: one intra-op thread, ``torch`` kept on it (imported
    here, in the replica, not where the classes are built), and its MLP from seed 0 if it has one."""
    import torch

    _one_thread()
    handler.torch = torch
    if sizes is not None:
        handler.model = make_mlp(sizes, seed=0, device=device)


def _log_load(model_id: str, seconds: float) -> None:
    """One line per load, appended (O_APPEND) to $BENCH_LOAD_LOG: how loads are counted on
    both systems, the same way (Modelplex's own counter is read as a cross-check)."""
    path = os.environ.get("BENCH_LOAD_LOG")
    if path:
        line = f"{os.getpid()} {model_id} {time.time():.6f} {seconds:.6f}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def build(sdk) -> SimpleNamespace:
    """The handler classes, decorated with ``sdk``'s ``multiplexed`` / ``batch``."""

    class MLP:
        """Workload 1, unbatched: one row per forward pass."""

        def __init__(self):
            _torch_handler(self, MLP_SIZES)

        async def __call__(self, body):
            torch = self.torch
            with torch.inference_mode():
                out = self.model(torch.tensor([body["inputs"]], dtype=torch.float32))
            return {"outputs": out[0].tolist()}

    class BatchedMLP:
        """Workload 1, batched: up to BATCH_MAX rows per forward pass."""

        def __init__(self):
            _torch_handler(self, MLP_SIZES)

        async def __call__(self, body):
            if hasattr(body, "tensors"):  # Modelplex's OIP over gRPC (run.py --grpc): a row in, its scores out
                import numpy as np

                answer = await self.predict({"inputs": body.tensors[0].reshape(-1).tolist()})
                return {"outputs": np.asarray([answer["outputs"]], dtype=np.float32)}
            return await self.predict(body)

        # Not on __call__ itself: Ray's adapter overrides __call__, and Ray's @batch finds its
        # `self` by looking the decorated method up by name on the instance.
        @sdk.batch(max_batch_size=BATCH_MAX, batch_wait_timeout_s=BATCH_WAIT_S)
        async def predict(self, bodies):
            if _OFFLOAD:  # an experiment (profile_modelplex.py --offload), off in the benchmark
                return await asyncio.to_thread(self._forward, bodies)
            return self._forward(bodies)

        def _forward(self, bodies):
            torch = self.torch
            with torch.inference_mode():
                out = self.model(torch.tensor([b["inputs"] for b in bodies], dtype=torch.float32))
            return [{"outputs": row} for row in out.tolist()]

    class BatchedEcho:
        """Workload 1's batching with no model: what a request costs the replica beyond its compute."""

        async def __call__(self, body):
            return await self.predict(body)

        @sdk.batch(max_batch_size=BATCH_MAX, batch_wait_timeout_s=BATCH_WAIT_S)
        async def predict(self, bodies):
            return [{"outputs": b["inputs"][:8]} for b in bodies]

    class GPUBatchedMLP:
        """GPU variant of workload 1: a larger MLP on CUDA, batches of up to GPU_BATCH_MAX."""

        def __init__(self):
            self.device = os.environ.get("BENCH_DEVICE", "cuda")
            sizes = tuple(int(s) for s in os.environ.get("BENCH_GPU_SIZES", ",".join(map(str, GPU_MLP_SIZES))).split(","))
            _torch_handler(self, sizes, device=self.device)

        async def __call__(self, body):
            if hasattr(body, "tensors"):  # Modelplex's OIP over gRPC (grpc_vs_rest.py)
                import numpy as np

                answer = await self.predict({"inputs": body.tensors[0].reshape(-1).tolist()})
                return {"outputs": np.asarray([[answer["max"]]], dtype=np.float32)}
            return await self.predict(body)

        @sdk.batch(max_batch_size=GPU_BATCH_MAX, batch_wait_timeout_s=GPU_BATCH_WAIT_S)
        async def predict(self, bodies):
            torch = self.torch
            with torch.inference_mode():
                x = torch.tensor([b["inputs"] for b in bodies], dtype=torch.float32).to(self.device)
                out = self.model(x)
                # Only a summary goes back: the point is the GPU batch, not JSON of 1024 floats.
                top = out.max(dim=1)
                values, indices = top.values.cpu().tolist(), top.indices.cpu().tolist()
            return [{"max": v, "argmax": i} for v, i in zip(values, indices)]

    class Multiplexed:
        """Workload 2: one small MLP per model id; a load is a simulated fetch plus real construction."""

        def __init__(self):
            _torch_handler(self)
            self.fetch_s = _env_float("BENCH_FETCH_S", 0.1)

        @sdk.multiplexed(max_num_models_per_replica=MUX_SLOTS)
        async def load_model(self, model_id: str):
            started = time.perf_counter()
            await asyncio.sleep(self.fetch_s)  # the weights coming over the network
            model = make_mlp(MUX_SIZES, seed=model_seed(model_id))
            _log_load(model_id, time.perf_counter() - started)
            return model

        async def __call__(self, body):
            torch = self.torch
            model_id = sdk.get_multiplexed_model_id()
            model = await self.load_model(model_id)
            with torch.inference_mode():
                out = model(torch.tensor([body["inputs"]], dtype=torch.float32))
            return {"model": model_id, "outputs": out[0, :8].tolist()}

    class Streamer:
        """Workload 3: an async generator of ``chunks`` records, ``interval_s`` apart (a token
        generator whose kernels leave the event loop free, as a GPU's would)."""

        def __init__(self):
            self.interval_s = _env_float("BENCH_STREAM_INTERVAL_S", 0.01)

        async def __call__(self, body):
            chunks = int(body.get("chunks", STREAM_CHUNKS))
            for i in range(chunks):
                if i:
                    await asyncio.sleep(self.interval_s)
                yield {"i": i, "token": f"token-{i:04d}"}

    class BusyMLP:
        """Workload 4, unbatched: a forward pass of a BUSY_ROWS-row batch, computed with synchronous
        torch right inside ``async def`` (no thread), as the seeds write handlers."""

        def __init__(self):
            _torch_handler(self, MLP_SIZES)

        async def __call__(self, body):
            torch = self.torch
            with torch.inference_mode():
                out = self.model(torch.tensor([body["inputs"]], dtype=torch.float32).repeat(BUSY_ROWS, 1))
            return {"outputs": out[0, :8].tolist()}

    class BusyStreamer:
        """Workload 4, streaming: an async generator that computes each chunk (one forward pass of
        a BUSY_ROWS-row batch, on its event loop) and yields it: a token generator on a CPU."""

        def __init__(self):
            _torch_handler(self, MLP_SIZES)

        async def __call__(self, body):
            torch = self.torch
            chunks = int(body.get("chunks", BUSY_CHUNKS))
            x = torch.tensor([body["inputs"]], dtype=torch.float32).repeat(BUSY_ROWS, 1)
            for i in range(chunks):
                with torch.inference_mode():
                    out = self.model(x)
                yield {"i": i, "token": int(out[i % BUSY_ROWS].argmax())}

    return SimpleNamespace(MLP=MLP, BatchedMLP=BatchedMLP, BatchedEcho=BatchedEcho, GPUBatchedMLP=GPUBatchedMLP,
                           Multiplexed=Multiplexed, Streamer=Streamer, BusyMLP=BusyMLP, BusyStreamer=BusyStreamer)
