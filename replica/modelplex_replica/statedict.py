"""``format: safetensors``: a ``state_dict`` saved with safetensors, put into the user's module class.

A file source is memory-mapped where it lies (``safetensors.safe_open``): the tensors are views of
the file's pages, so a load moves no bytes and holds no lock while it runs, and the serving
threads beside it keep their CPU, their memory bandwidth and the GIL (bench/swap). A model from
another source (http(s), s3) is downloaded into an anonymous file (in memory on Linux) or read
from the disk tier's copy, and mapped the same way (:func:`read_file` by the file's
``/proc/self/fd`` path); :func:`read_bytes` views bytes already held in memory.

The module is built on the ``meta`` device (no weights allocated, no random initialisation) and
the file's tensors are assigned to it (``load_state_dict(assign=True)``): the file's dtypes are
kept. A module whose ``__init__`` computes buffers that are not in its ``state_dict``
(``persistent=False``) is built for real instead, then given the file's tensors the same way.

Declared OIP metadata travels in the file's own metadata, under the key ``modelplex.json``
(``save_file(model.state_dict(), path, metadata={"modelplex.json": json.dumps({...})})``), as it
does in a TorchScript archive's extra files.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from safetensors import SafetensorError, safe_open

from modelplex.wire.errors import ModelLoadError

#: The key of a safetensors file's metadata that declares the model's OIP inputs and outputs.
METADATA_KEY = "modelplex.json"
#: How many missing or unexpected weight names an error lists.
_NAMES_SHOWN = 5


def read_file(model_id: str, path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors of a safetensors file, memory-mapped (copy-on-write views of its pages), and
    its declared metadata ("" when none). Missing file: :class:`FileNotFoundError`."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except FileNotFoundError:
        raise
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelLoadError(f"model {model_id!r} is not a safetensors file: {error}") from None
    return tensors, metadata.get(METADATA_KEY, "")


def read_bytes(model_id: str, data: bytes | bytearray) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors and declared metadata of a safetensors file held in memory. A writable buffer
    (an http(s) body, :func:`~modelplex_replica.sources.ModelSource.fetch`) is viewed in place,
    no copy; immutable ``bytes`` are copied once."""
    buffer = data if isinstance(data, bytearray) else bytearray(data)
    try:
        (length,) = struct.unpack_from("<Q", buffer)
        header = json.loads(bytes(buffer[8:8 + length]))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        tensors = {name: _view(buffer, 8 + length, name, entry) for name, entry in header.items()}
    except (struct.error, ValueError, TypeError, KeyError) as error:
        raise ModelLoadError(f"model {model_id!r} is not a safetensors file: {error}") from None
    return tensors, metadata.get(METADATA_KEY, "") if isinstance(metadata, dict) else ""


#: safetensors' dtype names (those torch has).
_DTYPES = {name: dtype for name, dtype in {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "U16": getattr(torch, "uint16", None), "U32": getattr(torch, "uint32", None),
    "U64": getattr(torch, "uint64", None), "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None)}.items() if dtype is not None}


def _view(buffer: bytearray, data_start: int, name: str, entry: Any) -> torch.Tensor:
    """One tensor of the file, a view of ``buffer``; its entry checked against the buffer."""
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise ValueError(f"tensor {name!r}: unknown dtype {entry['dtype']!r}")
    shape = [int(size) for size in entry["shape"]]
    begin, end = (int(offset) for offset in entry["data_offsets"])
    count = math.prod(shape)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if not 0 <= begin <= end <= len(buffer) - data_start or end - begin != count * itemsize:
        raise ValueError(f"tensor {name!r}: offsets {begin}..{end} do not hold {shape} of {entry['dtype']}")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype, count=count, offset=data_start + begin).reshape(shape)


def build_module(model_id: str, cls: Callable[..., Any], kwargs: Mapping[str, Any],
                 tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``cls(**kwargs)`` holding ``tensors`` as its state_dict (no copy); errors name the model
    and, for a mismatch, the weights missing from the file or unknown to the class."""
    name = getattr(cls, "__qualname__", repr(cls))
    try:
        with torch.device("meta"):
            module = cls(**kwargs)
    except Exception as error:  # noqa: BLE001 - the user's constructor may raise anything
        raise ModelLoadError(f"model {model_id!r}: {name}(**kwargs) failed: {type(error).__name__}: {error}") from None
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"model {model_id!r}: {name}(**kwargs) is not a torch.nn.Module")
    _assign(model_id, module, tensors)
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        # Buffers outside the state_dict exist only as __init__ computes them: build it for real.
        module = cls(**kwargs)
        _assign(model_id, module, tensors)
    return module.eval()


def _assign(model_id: str, module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        problems = [f"{label} {', '.join(names[:_NAMES_SHOWN])}" + (" ..." if len(names) > _NAMES_SHOWN else "")
                    for label, names in (("missing from the file:", missing), ("not in the module:", unexpected))
                    if names]
        raise ModelLoadError(f"model {model_id!r}: the file's weights do not fit {type(module).__qualname__} "
                             f"({'; '.join(problems)})")
    try:
        module.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as error:  # shapes that differ
        raise ModelLoadError(f"model {model_id!r}: the file's weights do not fit {type(module).__qualname__}: "
                             f"{str(error).splitlines()[-1].strip()}") from None
