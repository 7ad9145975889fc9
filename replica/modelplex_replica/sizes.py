"""How much memory a model takes, and how much the replica's models may take.

A model's size is measured when it is loaded: on CUDA, the caching allocator's growth on the
model's device while its load ran (the weights, and whatever else construction left
allocated), never less than its tensors' bytes; on CPU, the bytes of its parameters and
buffers. A handler whose models are not torch modules reports sizes itself with a
``model_bytes(self, model) -> int`` method (:mod:`modelplex.multiplex` prefers it).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

log = logging.getLogger("modelplex.replica")

#: Loads whose allocator count is remembered at once (a failed load never reports back).
_STARTS_KEPT = 1024
#: glibc's mallopt parameter number, and the size from which blocks always come from mmap.
_M_MMAP_THRESHOLD = -3
_MMAP_FROM_BYTES = 1 << 20


def device() -> torch.device:
    """Where models are loaded: the first GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def modules_in(model: Any, depth: int = 2) -> Iterator[torch.nn.Module]:
    """The torch modules a loaded model holds: itself, or its attributes and items, ``depth`` deep."""
    if isinstance(model, torch.nn.Module):  # ScriptModules are Modules too
        yield model
        return
    if depth == 0 or isinstance(model, (str, bytes, int, float, torch.Tensor)):
        return
    children: Iterable[Any]
    if isinstance(model, dict):
        children = model.values()
    elif isinstance(model, (list, tuple)):
        children = model
    elif dataclasses.is_dataclass(model):
        children = (getattr(model, f.name) for f in dataclasses.fields(model))
    else:
        children = getattr(model, "__dict__", {}).values()
    for child in children:
        yield from modules_in(child, depth - 1)


def tensors_in(model: Any) -> Iterator[torch.Tensor]:
    """Parameters and buffers of the model's modules, or the model itself if it is a tensor."""
    if isinstance(model, torch.Tensor):
        yield model
        return
    for module in modules_in(model):
        yield from module.parameters()
        yield from module.buffers()


def tensor_bytes(model: Any, on: torch.device | None = None) -> int | None:
    """Bytes of the model's tensors (storage shared between them counted once); None without any."""
    seen: set[tuple[str, int]] = set()
    total, found = 0, False
    for tensor in tensors_in(model):
        found = True
        if on is not None and tensor.device.type != on.type:
            continue
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total if found else None


class ModelSizer:
    """``load_started(model_id)`` as a load begins, ``size(model_id, model)`` once it is in."""

    def __init__(self, where: torch.device):
        self.device = where
        self._starts: OrderedDict[str, int] = OrderedDict()  # allocator count at each load's start
        self._overlapped: set[str] = set()

    def load_started(self, model_id: str) -> None:
        if self.device.type != "cuda":
            return
        if self._starts:  # loads that overlap share the allocator's growth: each is measured by its tensors
            self._overlapped.update(self._starts, (model_id,))
        self._starts[model_id] = torch.cuda.memory_allocated(self.device)
        while len(self._starts) > _STARTS_KEPT:
            self._overlapped.discard(self._starts.popitem(last=False)[0])

    def size(self, model_id: str, model: Any) -> int | None:
        if self.device.type != "cuda":
            return tensor_bytes(model)
        start = self._starts.pop(model_id, None)
        overlapped = model_id in self._overlapped
        self._overlapped.discard(model_id)
        own = tensor_bytes(model, self.device)
        if start is None or overlapped:
            return own
        grown = torch.cuda.memory_allocated(self.device) - start
        return max(grown, own or 0)


def device_memory_bytes(where: torch.device) -> int:
    """The device's memory: the GPU's, or on CPU the container's memory limit, else the machine's."""
    if where.type == "cuda":
        return torch.cuda.get_device_properties(where.index or 0).total_memory
    limit = _cgroup_memory_limit()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(limit, physical) if limit else physical


def _cgroup_memory_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def give_freed_weights_back() -> None:
    """Make every host allocation of 1 MiB or more its own mapping, returned to the OS on free.

    glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), so
    after the first evicted model, later weights are carved from malloc's heaps, and what an
    eviction frees stays resident: 400 loads of 20 MB models through a 9-model cache peaked at
    +656 MB of RSS, +237 MB with this (two loads at once, two worker threads).
    """
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM_BYTES)
    except (AttributeError, OSError):  # not glibc: its allocator has its own policy
        log.debug("mallopt is not available; large frees follow the C library's policy")
