"""Frames on the wire: tensors as JSON records, so every stage can stream them as NDJSON.

A streamed chunk must be one JSON value (the replica frames each as one NDJSON line; raw
bytes would run together), so a tensor travels as ``{"dtype", "shape", "data": base64}``.
Base64 costs a third more bytes than raw, which is small next to the stage costs, and keeps
every hop debuggable with ``curl``.
"""

from __future__ import annotations

import base64
import os

import torch

DTYPES = {"uint8": torch.uint8, "float32": torch.float32}


def pack(tensor: torch.Tensor) -> dict:
    """A tensor as a JSON-able record (contiguous bytes, base64)."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    data = tensor.contiguous().numpy().tobytes()
    return {"dtype": name, "shape": list(tensor.shape), "data": base64.b64encode(data).decode()}


def unpack(record: object) -> torch.Tensor:
    """The tensor of a :func:`pack` record; ``ValueError`` naming what is wrong otherwise."""
    if not isinstance(record, dict) or not {"dtype", "shape", "data"} <= record.keys():
        raise ValueError("expected a tensor record {dtype, shape, data}")
    dtype = DTYPES.get(record["dtype"])
    if dtype is None:
        raise ValueError(f"unsupported dtype {record['dtype']!r}")
    shape = [int(n) for n in record["shape"]]
    data = base64.b64decode(record["data"], validate=True)
    expected = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    if len(data) != expected:
        raise ValueError(f"tensor of shape {shape} needs {expected} bytes, got {len(data)}")
    # bytearray: torch wants a writable buffer; the copy is one chunk, not the video.
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def check_frames(frames: torch.Tensor) -> torch.Tensor:
    """Frames are uint8 ``[count, 3, height, width]`` (RGB); anything else is refused."""
    if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[1] != 3:
        raise ValueError(f"expected uint8 frames [N, 3, H, W], got {frames.dtype} {list(frames.shape)}")
    return frames


def cost_s(stage: str, default: float) -> float:
    """Simulated accelerator time per chunk for ``stage`` (``PIPELINE_<STAGE>_S`` overrides)."""
    return float(os.environ.get(f"PIPELINE_{stage.upper()}_S", default))
