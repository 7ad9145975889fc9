"""Ray Serve's naive video pipeline (seeds: performance optimization, 3, NaiveOrchestration):
decode the whole video, then detect faces and encode it, then answer with where it is stored.

The orchestrator is Ray's code with the imports changed: ``from ray import serve`` and
``from ray.serve.handle import DeploymentHandle`` name ``modelplex`` instead, and ``import ray``
is gone: the seed names ``ray.ObjectRef`` only in a local variable's annotation, which Python
never evaluates. The stages it calls are in ``video_stages.py`` (the seed leaves them out);
``DecodeVideo`` here answers with every batch at once. The client posts to the FastAPI route,
as the seed's would, and checks the video it gets back (``serve_and_check`` in
``video_stages.py``, shared with the streaming example).
"""

from typing import List

from fastapi import FastAPI
from video_stages import FusedDetectEncode, local_path, read_frames, serve_and_check, video_shape

from modelplex import serve
from modelplex.serve.handle import DeploymentHandle


@serve.deployment
class DecodeVideo:
    def decode(self, video_url: str, batch_size: int) -> list:
        path = local_path(video_url)
        frames = video_shape(path)[0]
        return [read_frames(path, start, batch_size) for start in range(0, frames, batch_size)]


# -- Ray's code, as the seed has it ----------------------------------------------------------

fastapi_app = FastAPI()

@serve.deployment
@serve.ingress(fastapi_app)
class NaiveOrchestration:
    def __init__(
        self,
        decode_video: DeploymentHandle,
        fused_detect_encode: DeploymentHandle,
    ) -> None:
        self.decode_video = decode_video
        self.fused_detect_encode = fused_detect_encode

    @fastapi_app.post("/detect_faces_naive")
    async def run(
        self,
        video_url: str,
        output_path: str,
        decode_batch_size: int = 20,
    ) -> str:
        # Decode entire video first (no streaming)
        frames: List[ray.ObjectRef] = await self.decode_video.decode.remote(
            video_url, decode_batch_size
        )

        # Process frames (run detection + encoding) and store video on blob store
        return await self.fused_detect_encode.run.remote(frames)

# ---------------------------------------------------------------------------------------------

serve_and_check("naive", lambda folder: NaiveOrchestration.bind(DecodeVideo.bind(), FusedDetectEncode.bind(str(folder))))
