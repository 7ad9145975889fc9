"""The three stages of the video pipeline, each its own deployment: decode, detect, encode.

The video is synthetic (seeded noise with a few bright moving squares standing in for faces),
so the example runs anywhere, but every stage does what its real counterpart does to the
data: decode makes frames, detect finds the faces and draws their boxes, encode compresses.
Each stage's accelerator time is simulated by ``asyncio.sleep`` (``PIPELINE_<STAGE>_S`` per
chunk) next to a little real torch work, and each replica has one accelerator: a lock lets
one chunk at a time through it, as one GPU would. That keeps the timings honest on a
two-core machine: stages overlap because they wait on different "GPUs", not because the
sleeps pile up on one.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import zlib
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from frames import check_frames, cost_s, pack, unpack

from modelplex import get_multiplexed_model_id, multiplexed
from modelplex.wire.errors import BadRequest

#: Seconds of accelerator time per chunk, in the seed's proportions (decode : detect : encode).
DECODE_S = cost_s("decode", 0.02)
DETECT_S = cost_s("detect", 0.12)
ENCODE_S = cost_s("encode", 0.06)
#: Fetching a detector's weights (the multiplexed load).
LOAD_S = cost_s("load", 0.3)

MAX_FRAMES = 100_000
MAX_SIDE = 1024
FACE_GREEN = torch.tensor([0, 255, 0], dtype=torch.uint8)


def _one_thread() -> None:
    # Several replicas share two cores: one intra-op thread each keeps them from fighting.
    torch.set_num_threads(1)


def _within(default: int, low: int, high: int) -> Any:
    """A field of a video description, with the range a request may ask for."""
    return field(default=default, metadata={"range": (low, high)})


@dataclass(frozen=True)
class Video:
    """What a request asks to decode: a synthetic clip, cut into chunks of ``chunk_frames``."""

    frames: int = _within(256, 1, MAX_FRAMES)
    chunk_frames: int = _within(8, 1, 1024)
    height: int = _within(96, 16, MAX_SIDE)
    width: int = _within(96, 16, MAX_SIDE)
    faces: int = _within(3, 0, 16)
    seed: int = 0

    @classmethod
    def from_body(cls, body: object) -> Video:
        if not isinstance(body, dict):
            raise BadRequest("expected a JSON object describing the video, e.g. {\"frames\": 256}")
        try:
            video = cls(**{f.name: int(body[f.name]) for f in fields(cls) if f.name in body})
        except (TypeError, ValueError) as error:
            raise BadRequest(f"bad video description: {error}") from None
        for f in fields(cls):
            if "range" in f.metadata:
                low, high = f.metadata["range"]
                if not low <= getattr(video, f.name) <= high:
                    raise BadRequest(f"{f.name} must be in {low}..{high} (got {getattr(video, f.name)})")
        return video

    @property
    def chunks(self) -> int:
        return -(-self.frames // self.chunk_frames)

    def render(self, chunk: int) -> torch.Tensor:
        """The frames of one chunk, the same whoever asks and in whatever order."""
        first = chunk * self.chunk_frames
        count = min(self.chunk_frames, self.frames - first)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + chunk)
        # Sensor noise: it keeps the frames from compressing to nothing, as real video does.
        frames = torch.randint(0, 48, (count, 3, self.height, self.width), generator=generator, dtype=torch.uint8)
        side = max(4, min(self.height, self.width) // 8)
        for face in range(self.faces):
            for offset in range(count):
                t = first + offset
                y = (11 * face + 3 * t) % (self.height - side)
                x = (29 * face + 5 * t + 7) % (self.width - side)
                frames[offset, :, y:y + side, x:x + side] = 205 + 3 * face
        return frames


class Decode:
    """Streams the decoded video, one chunk of frames at a time, as the decoder makes them."""

    def __init__(self):
        _one_thread()
        self.decoder = asyncio.Lock()

    async def __call__(self, body):
        video = Video.from_body(body)
        for chunk in range(video.chunks):
            async with self.decoder:
                frames = video.render(chunk)
                await asyncio.sleep(DECODE_S)
            yield {"chunk": chunk, "frames": pack(frames)}


@dataclass(frozen=True)
class FaceDetector:
    """A stand-in detector: a learned-looking luma filter, pooled over cells, thresholded."""

    model_id: str
    weights: torch.Tensor  # [1, 3, 1, 1]: how the model mixes the colour channels
    threshold: float
    cell: int = 4

    @classmethod
    def for_model(cls, model_id: str) -> FaceDetector:
        # Weights derive from the id, so two model ids really are two different models.
        digest = hashlib.blake2b(model_id.encode(), digest_size=4).digest()
        mix = torch.tensor([0.30, 0.59, 0.11]) + torch.tensor([b / 2550 for b in digest[:3]])
        return cls(model_id, (mix / mix.sum()).reshape(1, 3, 1, 1), threshold=120.0 + digest[3] % 40)

    def __call__(self, frames: torch.Tensor) -> tuple[list[list[list[int]]], torch.Tensor]:
        """Boxes ``[x, y, w, h]`` per frame, and the frames with the boxes drawn on them."""
        with torch.inference_mode():
            luma = F.conv2d(frames.float(), self.weights)
            score = F.avg_pool2d(luma, self.cell)[:, 0]
            hits = (score > self.threshold).nonzero().tolist()
        boxes: list[list[list[int]]] = [[] for _ in range(frames.shape[0])]
        annotated = frames.clone()
        c = self.cell
        for frame, row, col in hits:
            y, x = row * c, col * c
            boxes[frame].append([x, y, c, c])
            # Outline the cell: top and bottom rows, left and right columns.
            for ys, xs in ((slice(y, y + 1), slice(x, x + c)), (slice(y + c - 1, y + c), slice(x, x + c)),
                           (slice(y, y + c), slice(x, x + 1)), (slice(y, y + c), slice(x + c - 1, x + c))):
                annotated[frame, :, ys, xs] = FACE_GREEN.view(3, 1, 1)
        return boxes, annotated


class Detect:
    """Face detection, multiplexed: the request's model id picks the detector (``faces-v1``...)."""

    def __init__(self):
        _one_thread()
        self.gpu = asyncio.Lock()

    @multiplexed(max_num_models_per_replica=2)
    async def load_model(self, model_id: str) -> FaceDetector:
        await asyncio.sleep(LOAD_S)  # fetching the weights from a blob store
        return FaceDetector.for_model(model_id)

    async def __call__(self, body):
        model_id = get_multiplexed_model_id()
        if not model_id:
            raise BadRequest("detect needs a model id (header serve_multiplexed_model_id, e.g. faces-v1)")
        detector = await self.load_model(model_id)
        results = []
        for record in _chunks(body):
            frames = check_frames(unpack(record["frames"]))
            async with self.gpu:
                boxes, annotated = detector(frames)
                await asyncio.sleep(DETECT_S)
            results.append({"chunk": record["chunk"], "model": model_id, "boxes": boxes,
                            "frames": pack(annotated)})
        return {"chunks": results}


def encode_frames(frames: torch.Tensor) -> bytes:
    """A toy codec: each chunk starts with a key frame, then frame-to-frame deltas, deflated."""
    deltas = frames.clone()
    deltas[1:] = frames[1:] - frames[:-1]  # uint8 arithmetic wraps: exact and reversible
    header = ",".join(str(n) for n in frames.shape).encode() + b"\n"
    return header + zlib.compress(deltas.numpy().tobytes(), 1)


def decode_frames(data: bytes) -> torch.Tensor:
    """The inverse of :func:`encode_frames` (for clients and tests that check the output)."""
    header, _, body = data.partition(b"\n")
    shape = [int(n) for n in header.split(b",")]
    deltas = torch.frombuffer(bytearray(zlib.decompress(body)), dtype=torch.uint8).reshape(shape)
    return torch.cumsum(deltas.to(torch.int64), dim=0).remainder(256).to(torch.uint8)


class Encode:
    """Encodes annotated chunks; each encoded chunk stands alone, so they concatenate in order."""

    def __init__(self):
        _one_thread()
        self.encoder = asyncio.Lock()

    async def __call__(self, body):
        results = []
        for record in _chunks(body):
            frames = check_frames(unpack(record["frames"]))
            async with self.encoder:
                data = encode_frames(frames)
                await asyncio.sleep(ENCODE_S)
            results.append({"chunk": record["chunk"], "frames": int(frames.shape[0]), "model": record.get("model"),
                            "boxes": record.get("boxes"), "encoded": base64.b64encode(data).decode()})
        return {"chunks": results}


def _chunks(body: object) -> list[dict]:
    """The ``{"chunks": [...]}`` a detect or encode call carries (one chunk, or a whole video)."""
    if not isinstance(body, dict) or not isinstance(body.get("chunks"), list):
        raise BadRequest('expected {"chunks": [{"chunk": i, "frames": {...}}, ...]}')
    for record in body["chunks"]:
        if not isinstance(record, dict) or "chunk" not in record or "frames" not in record:
            raise BadRequest('each chunk needs "chunk" and "frames"')
    return body["chunks"]
