"""The warm tier: where a model evicted from the device waits, so coming back is a copy.

- :class:`HostTier` (beside a GPU): an evicted model's tensors move to host memory (pinned,
  so the copy back runs at full PCIe speed), up to ``hostCacheBytes``; the oldest go first.
  Bringing one back is a copy of each tensor to the device, not a fetch plus construction: the
  same module objects (a scripted or compiled module keeps its state), their tensors copied
  without blocking on a CUDA stream of the tier's own, so the kernels of the models serving
  meanwhile are not queued behind the copy; the load waits for that stream alone.
- :class:`DiskTier` (CPU only): the model is in host memory already, so the tier is a
  local-disk copy of the fetched file (an ``emptyDir`` in pods), up to ``hostCacheBytes``; a
  re-load reads it instead of the network.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, Callable

import torch

from modelplex.cache import release
from modelplex_replica.sizes import modules_in
from modelplex_replica.sources import write_all

log = logging.getLogger("modelplex.replica")


class HostTier:
    """Evicted models in host memory, least recently evicted dropped first."""

    def __init__(self, capacity_bytes: int, where: torch.device):
        self.capacity_bytes = capacity_bytes
        self.device = where
        self._models: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._stream: Any = None  # torch.cuda.Stream, made on the first copy back

    @property
    def bytes_used(self) -> int:
        return sum(nbytes for _, nbytes in self._models.values())

    def holds(self, model_id: str) -> bool:
        return model_id in self._models

    async def keep(self, model_id: str, model: Any, nbytes: int) -> bool:
        modules = list(modules_in(model))
        if not modules or nbytes > self.capacity_bytes:
            return False
        while self._models and self.bytes_used + nbytes > self.capacity_bytes:
            dropped_id, (dropped, _) = self._models.popitem(last=False)
            log.info("Dropped model %r from the warm tier.", dropped_id)
            await release(dropped, dropped_id)
        await asyncio.to_thread(to_host, modules, self._copy_stream())
        self._models[model_id] = (model, nbytes)
        return True

    async def take(self, model_id: str) -> Any | None:
        held = self._models.pop(model_id, None)
        if held is None:
            return None
        model = held[0]
        await asyncio.to_thread(to_device, list(modules_in(model)), self.device, self._copy_stream())
        return model

    def _copy_stream(self) -> Any:
        """The tier's own CUDA stream (None on CPU): copies both ways run there."""
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    async def close(self) -> None:
        while self._models:
            model_id, (model, _) = self._models.popitem()
            await release(model, model_id)


def _tensors(modules: list[torch.nn.Module]) -> list[torch.Tensor]:
    """The modules' parameters and buffers, each once (tied weights, shared submodules)."""
    seen: dict[int, torch.Tensor] = {}
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            seen.setdefault(id(tensor), tensor)
    return list(seen.values())


def to_host(modules: list[torch.nn.Module], stream: Any = None) -> None:
    """Each tensor into host memory, pinned where CUDA is (straight from the device into the
    pinned buffer: no pageable copy between), on ``stream`` where one is given. The modules
    stay the same objects."""
    pin = torch.cuda.is_available()
    tensors = [t for t in _tensors(modules) if not (t.device.type == "cpu" and (t.is_pinned() or not pin))]
    with torch.no_grad():
        if stream is None:
            for tensor in tensors:
                host = torch.empty_like(tensor, device="cpu", pin_memory=pin)
                host.copy_(tensor.data)
                tensor.data = host
            return
        # After what was queued for the model already (its last request's kernels), beside
        # what serving queues from now on.
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream):
            for tensor in tensors:
                host = torch.empty_like(tensor, device="cpu", pin_memory=True)
                host.copy_(tensor.data, non_blocking=True)
                if tensor.is_cuda:
                    tensor.data.record_stream(stream)  # its device memory is not reused before the copy
                tensor.data = host
        stream.synchronize()


def to_device(modules: list[torch.nn.Module], where: torch.device, stream: Any = None) -> None:
    """Each tensor back to ``where``; on CUDA a non-blocking copy from pinned memory on
    ``stream``, waited for alone (``torch.cuda.synchronize`` would also wait for every kernel
    the serving models queued). The copies are recorded on the current stream, where the model
    then runs, so the allocator never hands their memory out while a kernel may still read it."""
    tensors = _tensors(modules)
    with torch.no_grad():
        if where.type != "cuda" or stream is None:
            for tensor in tensors:
                tensor.data = tensor.data.to(where)
            return
        with torch.cuda.stream(stream):
            for tensor in tensors:
                tensor.data = tensor.data.to(where, non_blocking=True)
        stream.synchronize()
        serving = torch.cuda.current_stream(where)
        for tensor in tensors:
            tensor.data.record_stream(serving)


def read_into_buffer(path: Path) -> bytearray:
    """A file's bytes read straight into one writable buffer (``readinto``: no second copy, and
    the GIL is released while the kernel copies)."""
    with open(path, "rb") as file:
        buffer = bytearray(os.fstat(file.fileno()).st_size)
        view, at = memoryview(buffer), 0
        while at < len(buffer):
            got = file.readinto(view[at:])
            if not got:
                raise OSError(f"{path.name} shrank while it was read")
            at += got
    return buffer


def copy_file(source: IO[bytes], target: IO[bytes], nbytes: int) -> None:
    """The first ``nbytes`` of an open file into another (unbuffered, at its current offset), in
    the kernel where it can (``os.sendfile`` from a file works on Linux; elsewhere by chunks)."""
    at = 0
    while hasattr(os, "sendfile") and at < nbytes:  # bounded: each round sends bytes or stops
        try:
            sent = os.sendfile(target.fileno(), source.fileno(), at, nbytes - at)
        except OSError:
            break  # no kernel copy between these two: by chunks below, from where it stopped
        if not sent:
            raise OSError(f"the source ended after {at} of {nbytes} bytes")
        at += sent
    source.seek(at)
    while at < nbytes:
        chunk = source.read(min(nbytes - at, 1 << 20))
        if not chunk:
            raise OSError(f"the source ended after {at} of {nbytes} bytes")
        write_all(target, chunk)
        at += len(chunk)


class DiskTier:
    """Copies of fetched model files in a local folder, least recently used dropped first.

    Thread-safe: the built-in loader reads and writes it from worker threads.
    """

    def __init__(self, capacity_bytes: int, directory: str | Path | None = None):
        self.capacity_bytes = capacity_bytes
        self._own = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="modelplex-warm-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files: OrderedDict[str, int] = OrderedDict()  # file name -> bytes
        self._lock = threading.Lock()

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return sum(self._files.values())

    @staticmethod
    def _name(model_id: str) -> str:
        return hashlib.sha256(model_id.encode()).hexdigest()

    def open(self, model_id: str) -> IO[bytes] | None:
        """The copy, opened (for a loader that reads by path: :func:`~modelplex_replica.sources.fd_path`;
        an open file stays readable even if the tier drops it meanwhile); the caller closes it."""
        return self._get(model_id, lambda path: open(path, "rb", buffering=0))

    def _get(self, model_id: str, reader: Callable[[Path], Any]) -> Any:
        name = self._name(model_id)
        with self._lock:
            if name not in self._files:
                return None
            self._files.move_to_end(name)
        try:
            return reader(self.directory / name)
        except OSError:
            with self._lock:
                self._files.pop(name, None)
            return None

    def write_from(self, model_id: str, file: IO[bytes]) -> bool:
        """Keep a copy of what ``file`` holds (copied by the kernel where it can: no bytes pass
        through Python); False when it is larger than the whole tier."""
        nbytes = os.fstat(file.fileno()).st_size

        def fill(path: Path) -> None:
            with open(path, "wb", buffering=0) as target:
                copy_file(file, target, nbytes)

        return self._keep(model_id, nbytes, fill)

    def _keep(self, model_id: str, nbytes: int, fill: Callable[[Path], Any]) -> bool:
        if nbytes > self.capacity_bytes:
            return False
        name = self._name(model_id)
        with self._lock:
            self._files.pop(name, None)
            while self._files and sum(self._files.values()) + nbytes > self.capacity_bytes:
                old, _ = self._files.popitem(last=False)
                (self.directory / old).unlink(missing_ok=True)
        partial = self.directory / f".{name}.{threading.get_ident()}"
        try:
            fill(partial)
            os.replace(partial, self.directory / name)  # readers never see half a file
        except OSError as error:
            log.warning("cannot keep a disk copy of model %r: %s", model_id, error)
            partial.unlink(missing_ok=True)
            return False
        with self._lock:
            self._files[name] = nbytes
            while sum(self._files.values()) > self.capacity_bytes:  # another thread's write raced in
                old, _ = self._files.popitem(last=False)
                (self.directory / old).unlink(missing_ok=True)
        return True

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.directory, ignore_errors=True)
