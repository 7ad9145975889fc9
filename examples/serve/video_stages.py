"""The stages behind the seeds' video orchestrators (seeds: performance optimization, 3).

The seed shows only the orchestrators; these are the deployments they call, small but real:
``FusedDetectEncode`` finds the face in every frame with a torch model (a box filter over
luminance), draws a red box around it and encodes the frames; ``ConcatVideo`` writes encoded
chunks, in order, as one output video. Each example decodes with its own ``DecodeVideo``.

A video here is a file of raw RGB frames behind a small header (:func:`make_video` writes one:
a bright square, the face, moving over noise). An encoded chunk is one zlib stream of frames;
an output video is its chunks, each after its length (:func:`read_video` reads it back).
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable

import requests
import torch

from modelplex import serve

FACE = 8  # the face's side, in pixels
RED = torch.tensor([255, 0, 0], dtype=torch.uint8)
_HEADER = struct.Struct("<III")  # frames, height, width
_LENGTH = struct.Struct("<I")


def make_video(path: str | Path, frames: int, size: int = 64) -> list[tuple[int, int]]:
    """Write a video whose face moves across it; the face's top-left corner in each frame."""
    generator = torch.Generator().manual_seed(7)
    video = torch.randint(0, 60, (frames, size, size, 3), dtype=torch.uint8, generator=generator)
    corners = []
    for index in range(frames):
        y, x = (3 * index) % (size - FACE), (5 * index) % (size - FACE)
        video[index, y:y + FACE, x:x + FACE] = 220
        corners.append((y, x))
    Path(path).write_bytes(_HEADER.pack(frames, size, size) + video.numpy().tobytes())
    return corners


def local_path(video_url: str) -> Path:
    """The file a ``file://`` URL (or a plain path) names; the examples' blob store is a folder."""
    if "://" in video_url and not video_url.startswith("file://"):
        raise ValueError(f"only file:// videos can be read here (got {video_url!r})")
    return Path(video_url.removeprefix("file://"))


def video_shape(path: Path) -> tuple[int, int, int]:
    with path.open("rb") as file:
        return _HEADER.unpack(file.read(_HEADER.size))


def read_frames(path: Path, start: int, count: int) -> torch.Tensor:
    """Frames ``start`` to ``start + count`` of the video, read from the file (and no others)."""
    frames, height, width = video_shape(path)
    count = max(0, min(count, frames - start))
    frame_bytes = height * width * 3
    with path.open("rb") as file:
        file.seek(_HEADER.size + start * frame_bytes)
        data = bytearray(file.read(count * frame_bytes))
    return torch.frombuffer(data, dtype=torch.uint8).reshape(count, height, width, 3)


class FaceDetector(torch.nn.Module):
    """The top-left corner of the brightest FACE x FACE square of each frame."""

    def __init__(self):
        super().__init__()
        self.box = torch.nn.Conv2d(1, 1, FACE, bias=False)
        with torch.no_grad():
            self.box.weight.fill_(1.0 / (FACE * FACE))
        self.register_buffer("luma", torch.tensor([0.299, 0.587, 0.114]))

    @torch.inference_mode()
    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        luminance = (frames.float() @ self.luma).unsqueeze(1)  # N x 1 x H x W
        best = self.box(luminance).flatten(1).argmax(dim=1)
        width = frames.shape[2] - FACE + 1
        return torch.stack([best // width, best % width], dim=1)


def draw_boxes(frames: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
    """The frames with a red box on the edge of each face."""
    boxed = frames.clone()
    for frame, (y, x) in zip(boxed, corners.tolist()):
        frame[y, x:x + FACE] = RED
        frame[y + FACE - 1, x:x + FACE] = RED
        frame[y:y + FACE, x] = RED
        frame[y:y + FACE, x + FACE - 1] = RED
    return boxed


def encode(frames: torch.Tensor) -> bytes:
    count, height, width, _ = frames.shape
    return zlib.compress(_HEADER.pack(count, height, width) + frames.contiguous().numpy().tobytes(), 1)


def decode_chunk(chunk: bytes) -> torch.Tensor:
    data = zlib.decompress(chunk)
    count, height, width = _HEADER.unpack_from(data)
    return torch.frombuffer(bytearray(data[_HEADER.size:]), dtype=torch.uint8).reshape(count, height, width, 3)


def write_video(path: str | Path, chunks: list[bytes]) -> None:
    with Path(path).open("wb") as file:
        for chunk in chunks:
            file.write(_LENGTH.pack(len(chunk)) + chunk)


def read_video(path: str | Path) -> tuple[torch.Tensor, int]:
    """An output video's frames, and the number of chunks they came in."""
    data = Path(path).read_bytes()
    chunks, offset = [], 0
    while offset < len(data):
        (length,) = _LENGTH.unpack_from(data, offset)
        chunks.append(decode_chunk(data[offset + _LENGTH.size:offset + _LENGTH.size + length]))
        offset += _LENGTH.size + length
    return torch.cat(chunks), len(chunks)


def boxed_at(frames: torch.Tensor, corners: list[tuple[int, int]]) -> int:
    """How many frames have their red box exactly on the face."""
    return sum(bool((frame[y, x] == RED).all() and (frame[y + FACE - 1, x + FACE - 1] == RED).all()
                    and not (frame[y + 1, x + 1] == RED).all())
               for frame, (y, x) in zip(frames, corners))


def digest(frames: torch.Tensor) -> str:
    return hashlib.sha256(frames.contiguous().numpy().tobytes()).hexdigest()[:16]


@serve.deployment
class FusedDetectEncode:
    """Face detection and encoding, fused in one deployment (one hop less per chunk)."""

    def __init__(self, blob_store: str):
        self.detector = FaceDetector()
        self.blob_store = Path(blob_store)

    async def run(self, frames: torch.Tensor | list[torch.Tensor]) -> bytes | str:
        """A batch of frames: its encoded chunk. A whole video (a list of batches): the encoded
        video, stored in the blob store: its path."""
        if isinstance(frames, list):
            chunk = self.detect_encode(torch.cat(frames))
            path = self.blob_store / f"{hashlib.sha256(chunk).hexdigest()[:16]}.video"
            write_video(path, [chunk])
            return str(path)
        return self.detect_encode(frames)

    def detect_encode(self, frames: torch.Tensor) -> bytes:
        return encode(draw_boxes(frames, self.detector(frames)))


@serve.deployment
class ConcatVideo:
    """Encoded chunks, in order, as one video at ``output_path`` (the blob store)."""

    async def concat(self, output_path: str, *chunks: bytes) -> str:
        write_video(local_path(output_path), list(chunks))
        return output_path


def serve_and_check(name: str, app: Callable[[Path], Any]) -> None:
    """The client side of both orchestrator examples: a 60-frame video in a temporary folder
    (the blob store), ``app(folder)`` run, one POST to its ``/detect_faces_<name>`` route, as the
    seed's client would, and what came back read and checked (frames, chunks, boxed faces)."""
    folder = Path(tempfile.mkdtemp(prefix=f"video-{name}-"))
    atexit.register(shutil.rmtree, folder, True)
    corners = make_video(folder / "input.video", frames=60)
    serve.run(app(folder))

    response = requests.post(
        f"http://localhost:8000/detect_faces_{name}",
        params={"video_url": f"file://{folder}/input.video", "output_path": str(folder / "output.video")},
    )
    print(response.status_code, response.json())
    frames, chunks = read_video(response.json())
    print(f"{len(frames)} frames in {chunks} chunk(s), {boxed_at(frames, corners)} with a box on the face")
    print(f"video digest {digest(frames)}")
