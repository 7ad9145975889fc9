"""The warm tier: where a model evicted from the device waits, so coming back is a copy.

- :class:`HostTier` (beside a GPU): an evicted model's tensors move to host memory (pinned,
  so the copy back runs at full PCIe speed), up to ``hostCacheBytes``; the oldest go first.
  Bringing one back is ``module.to(device)``, not a fetch plus construction.
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
from typing import Any

import torch

from modelplex.cache import release
from modelplex_replica.sizes import modules_in

log = logging.getLogger("modelplex.replica")


class HostTier:
    """Evicted models in host memory, least recently evicted dropped first."""

    def __init__(self, capacity_bytes: int, where: torch.device):
        self.capacity_bytes = capacity_bytes
        self.device = where
        self._models: OrderedDict[str, tuple[Any, int]] = OrderedDict()

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
        await asyncio.to_thread(_to_host, modules)
        self._models[model_id] = (model, nbytes)
        return True

    async def take(self, model_id: str) -> Any | None:
        held = self._models.pop(model_id, None)
        if held is None:
            return None
        model = held[0]
        await asyncio.to_thread(_to_device, list(modules_in(model)), self.device)
        return model

    async def close(self) -> None:
        while self._models:
            model_id, (model, _) = self._models.popitem()
            await release(model, model_id)


def _to_host(modules: list[torch.nn.Module]) -> None:
    for module in modules:
        module.to("cpu")
        if torch.cuda.is_available():
            with torch.no_grad():
                for tensor in (*module.parameters(), *module.buffers()):
                    tensor.data = tensor.data.pin_memory()


def _to_device(modules: list[torch.nn.Module], where: torch.device) -> None:
    for module in modules:
        module.to(where, non_blocking=True)
    if where.type == "cuda":
        torch.cuda.synchronize(where)


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

    def read(self, model_id: str) -> bytes | None:
        name = self._name(model_id)
        with self._lock:
            if name not in self._files:
                return None
            self._files.move_to_end(name)
        try:
            return (self.directory / name).read_bytes()
        except OSError:
            with self._lock:
                self._files.pop(name, None)
            return None

    def write(self, model_id: str, data: bytes) -> bool:
        """Keep a copy; False when it is larger than the whole tier."""
        if len(data) > self.capacity_bytes:
            return False
        name = self._name(model_id)
        with self._lock:
            self._files.pop(name, None)
            while self._files and sum(self._files.values()) + len(data) > self.capacity_bytes:
                old, _ = self._files.popitem(last=False)
                (self.directory / old).unlink(missing_ok=True)
        partial = self.directory / f".{name}.{threading.get_ident()}"
        try:
            partial.write_bytes(data)
            os.replace(partial, self.directory / name)  # readers never see half a file
        except OSError as error:
            log.warning("cannot keep a disk copy of model %r: %s", model_id, error)
            partial.unlink(missing_ok=True)
            return False
        with self._lock:
            self._files[name] = len(data)
            while sum(self._files.values()) > self.capacity_bytes:  # another thread's write raced in
                old, _ = self._files.popitem(last=False)
                (self.directory / old).unlink(missing_ok=True)
        return True

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.directory, ignore_errors=True)
