"""Ray Serve's streaming video pipeline (seeds: performance optimization, 3, StreamingOrchestration):
frames are decoded batch by batch, and each batch goes to detection and encoding as soon as it
is decoded; the encoded chunks are concatenated into the output video.

The orchestrator is Ray's code with the imports changed: ``from ray import serve`` and
``from ray.serve.handle import DeploymentHandle`` name ``modelplex`` instead, and ``import ray``
is gone: the seed names ``ray.ObjectRef`` only in a local variable's annotation, which Python
never evaluates. ``_to_object_ref_gen()`` gives the stream's items as references that other
calls take as arguments, as in Ray (Modelplex has no object store: each item passes through
the orchestrator). The stages are in ``video_stages.py``; ``DecodeVideo`` here is a generator
that reads one batch of frames from the file each time the orchestrator asks for the next.
"""

from typing import List

from fastapi import FastAPI
from video_stages import ConcatVideo, FusedDetectEncode, local_path, read_frames, serve_and_check, video_shape

from modelplex import serve
from modelplex.serve.handle import DeploymentHandle


@serve.deployment
class DecodeVideo:
    def decode(self, video_url: str, batch_size: int):
        path = local_path(video_url)
        for start in range(0, video_shape(path)[0], batch_size):
            print(f"decoded frames {start}-{start + batch_size - 1}")
            yield read_frames(path, start, batch_size)


# -- Ray's code, as the seed has it ----------------------------------------------------------

fastapi_app = FastAPI()

@serve.deployment
@serve.ingress(fastapi_app)
class StreamingOrchestration:
    def __init__(
        self,
        decode_video: DeploymentHandle,
        fused_detect_encode: DeploymentHandle,
        concat_video: DeploymentHandle,
    ) -> None:
        self.decode_video = decode_video.options(stream=True) # Enable streaming
        self.fused_detect_encode = fused_detect_encode
        self.concat_video = concat_video

    @fastapi_app.post("/detect_faces_streaming")
    async def run(
        self,
        video_url: str,
        output_path: str,
        decode_batch_size: int = 20,
    ) -> str:
        # Decode yields batches of frames incrementally (streaming)
        frames_iter = self.decode_video.decode.remote(video_url, decode_batch_size)
        encoded_video_refs: List[ray.ObjectRef] = []
        obj_ref_gen = await frames_iter._to_object_ref_gen()
        
        # Process frames as they arrive (detection + encoding)
        async for frame_ref in obj_ref_gen:
            encoded_video_refs.append(
                self.fused_detect_encode.run.remote(frame_ref)
            )

        # Concatenate encoded video chunks and store video on blob store
        return await self.concat_video.concat.remote(
            output_path,
            *encoded_video_refs
        )

# ---------------------------------------------------------------------------------------------

serve_and_check("streaming", lambda folder: StreamingOrchestration.bind(
    DecodeVideo.bind(), FusedDetectEncode.bind(str(folder)), ConcatVideo.bind()))
