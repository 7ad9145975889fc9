"""The example video pipeline (examples/pipeline) end to end: decode → detect → encode as
three deployments, driven by the naive and the streaming orchestrators, all run by
``modelplex local``. The decoder is the example's, traced (traced.py): it tells the test how
many chunks it made and how it stopped."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import time
import zlib
from pathlib import Path

import aiohttp
import pytest

from modelplex.wire.names import MODEL_ID_HEADER

#: A chunk of 8 frames of 3 x 96 x 96 bytes: 221 KB of frames (295 KB as a JSON record).
CHUNK_FRAMES, SIDE = 8, 96
CHUNK_BYTES = CHUNK_FRAMES * 3 * SIDE * SIDE
#: A stopped consumer may leave the decoder ahead by the window (4 chunks), up to two chunks
#: in hand in each of the five processes on the way, and what the four TCP hops hold (decoder → its router →
#: orchestrator → its router → client): each hop a socket's send and receive buffers, at
#: most the kernel's limits (tcp_wmem, tcp_rmem: loopback buffers autotune up to those),
#: and aiohttp's read buffer (512 KiB). Measured here: about 5 MB a hop, 100-180 chunks.
TCP_HOPS = 4
AIOHTTP_READ_BUFFER = 512 * 1024


def kernel_socket_limit() -> int:
    """The most one TCP connection can hold in flight: send plus receive buffer maxima."""
    def maximum(name: str) -> int:
        return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return maximum("tcp_wmem") + maximum("tcp_rmem")


def max_chunks_ahead() -> int:
    held = TCP_HOPS * (kernel_socket_limit() + AIOHTTP_READ_BUFFER)
    # Records are bigger than CHUNK_BYTES (base64, JSON), so bytes / CHUNK_BYTES overcounts: safe.
    return 4 + 2 * 5 + -(-held // CHUNK_BYTES)


class Lines:
    """NDJSON records off a response as they arrive (records here pass aiohttp's readline limit)."""

    def __init__(self, response: aiohttp.ClientResponse):
        self.content = response.content
        self.buffer = b""

    async def next(self, timeout: float = 30.0) -> dict | None:
        """The next record; ``None`` at a clean end. Raises what the connection raises."""
        async with asyncio.timeout(timeout):
            while b"\n" not in self.buffer:
                data = await self.content.readany()
                if not data:
                    return json.loads(self.buffer) if self.buffer.strip() else None
                self.buffer += data
            line, _, self.buffer = self.buffer.partition(b"\n")
            return json.loads(line)


async def until(predicate, timeout: float = 30.0) -> None:
    """Poll ``predicate`` (plain or async) until it is true, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {predicate.__name__}"
        await asyncio.sleep(0.05)


async def settled(read, quiet_s: float = 1.5, timeout: float = 60.0) -> int:
    """The value of ``read()`` once it has not changed for ``quiet_s`` (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"still changing after {timeout:g} s (at {value})"
        await asyncio.sleep(0.1)
        if (now := read()) != value:
            value, since = now, time.monotonic()
    return value


def video(frames: int, trace: Path | None = None, **extra) -> dict:
    body = {"frames": frames, "chunk_frames": CHUNK_FRAMES, "height": SIDE, "width": SIDE, "seed": 7, **extra}
    if trace is not None:
        trace.mkdir(exist_ok=True)
        body["trace"] = str(trace)
    return body


def produced(trace: Path) -> int:
    try:
        return int((trace / "produced").read_text())
    except (OSError, ValueError):
        return 0


def outcome(trace: Path) -> str:
    try:
        return (trace / "outcome").read_text()
    except OSError:
        return ""


async def test_streaming_and_naive_make_the_same_video_with_the_requests_model(video_stack, session):
    body = video(48)  # 6 chunks
    headers = {MODEL_ID_HEADER: "faces-v2"}
    async with session.post(video_stack.url("streaming") + "/", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("application/x-ndjson")
        streamed = [json.loads(line) for line in (await response.read()).splitlines()]
    async with session.post(video_stack.url("naive") + "/", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        naive = (await response.json())["chunks"]

    assert streamed == naive
    assert [record["chunk"] for record in streamed] == list(range(6))
    for record in streamed:
        # The orchestrator passed its request's model id on to detect, which found the faces.
        assert record["model"] == "faces-v2"
        assert record["frames"] == CHUNK_FRAMES and all(record["boxes"])
        header, _, data = base64.b64decode(record["encoded"]).partition(b"\n")
        assert header == f"{CHUNK_FRAMES},3,{SIDE},{SIDE}".encode()
        assert len(zlib.decompress(data)) == CHUNK_BYTES
    # Detect's router saw the model id: faces-v2 is now loaded beside the prewarmed faces-v1.
    async with session.get(video_stack.url("detect") + "/v1/replicas") as response:
        (replica,) = (await response.json())["replicas"]
    assert sorted(replica["models"]) == ["faces-v1", "faces-v2"]


async def test_the_first_output_arrives_before_the_decoder_has_finished(video_stack, session, tmp_path):
    trace, gate = tmp_path / "trace", tmp_path / "let-the-decoder-finish"
    body = video(80, trace, hold_last_until=str(gate))  # 10 chunks; the last waits for the gate
    async with session.post(video_stack.url("streaming") + "/", json=body,
                            headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        assert response.status == 200, await response.text()
        lines = Lines(response)
        first = await lines.next()
        # Encoded output is out while the decoder has not finished (it cannot: the gate is shut).
        assert first["chunk"] == 0 and first["model"] == "faces-v1"
        assert outcome(trace) == ""
        assert produced(trace) < 10
        gate.touch()
        rest = []
        while (record := await lines.next()) is not None:
            rest.append(record["chunk"])
    assert rest == list(range(1, 10))
    assert outcome(trace) == "done 10"


async def test_a_failing_middle_stage_ends_the_stream_with_its_error(video_stack, session, tmp_path):
    trace = tmp_path / "trace"
    body = video(800, trace, corrupt_chunk=3)  # detect refuses chunk 3; 100 chunks in all
    async with session.post(video_stack.url("streaming") + "/", json=body,
                            headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        assert response.status == 200, await response.text()
        lines = Lines(response)
        records = [await lines.next() for _ in range(4)]
        # The stream is cut after the error record, so it never looks finished.
        with pytest.raises(aiohttp.ClientPayloadError):
            await lines.next()
    assert [record["chunk"] for record in records[:3]] == [0, 1, 2]
    error = records[3]["error"]
    assert error["code"] == "handler_error"
    assert error["message"].startswith("detect: ")
    assert "expected uint8 frames [N, 3, H, W]" in error["message"]
    # The decoder was stopped too, far from the end of the video.
    await until(lambda: outcome(trace).startswith("stopped"))
    assert produced(trace) < 100


async def test_a_failing_stage_gives_the_naive_client_a_clear_error(video_stack, session):
    async with session.post(video_stack.url("naive") + "/", json=video(40, corrupt_chunk=2),
                            headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        assert response.status == 500
        error = (await response.json())["error"]
    assert error["code"] == "handler_error"
    assert error["message"].startswith("detect: ") and "expected uint8 frames" in error["message"]


async def test_the_naive_orchestrator_refuses_a_video_it_cannot_hold_and_stops_the_decoder(
        video_stack, session, tmp_path):
    # It holds the whole decoded video (at most 4 MiB in these tests); 100 chunks pass that.
    trace = tmp_path / "trace"
    async with session.post(video_stack.url("naive") + "/", json=video(800, trace),
                            headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        assert response.status == 413, await response.text()
        error = (await response.json())["error"]
    assert error["code"] == "payload_too_large" and "streaming orchestrator" in error["message"]
    await until(lambda: outcome(trace).startswith("stopped"))
    assert produced(trace) < 100


async def test_a_slow_consumer_holds_the_decoder_back(video_stack, session, tmp_path):
    trace = tmp_path / "trace"
    bound = max_chunks_ahead()
    total = bound + 300  # chunks: were the decoder to run to the end, it would pass the bound
    # A short video first, so that what the stack's processes allocate for any video (buffers
    # and allocator pools sized by these chunks) is in the baseline.
    async with session.post(video_stack.url("streaming") + "/", json=video(20 * CHUNK_FRAMES),
                            headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        assert response.status == 200 and len((await response.read()).splitlines()) == 20
    rss_before = video_stack.rss_bytes()
    async with session.post(video_stack.url("streaming") + "/", json=video(total * CHUNK_FRAMES, trace),
                            headers={MODEL_ID_HEADER: "faces-v1"}) as response:
        assert response.status == 200, await response.text()
        lines = Lines(response)
        for _ in range(3):
            await lines.next()
        # Stop reading, and wait for the decoder to stop too (its count stays the same).
        made = await settled(lambda: produced(trace))
        growth = video_stack.rss_bytes() - rss_before
        print(f"decoder stopped {made - 3} chunks ahead of the consumer ({(made - 3) * CHUNK_BYTES >> 20} MB; "
              f"bound {bound}); the stack's memory grew {growth >> 20} MB")
        assert outcome(trace) == ""
        assert made - 3 <= bound
        # What is ahead sits in socket buffers, not in the processes: had a stage buffered the
        # rest of the video, it would hold (total - made) chunks.
        assert growth < (total - made) * CHUNK_BYTES / 2
        # Reading again lets it go on. How much must be read first varies (4 to 12 records
        # measured here): each hop's buffers drain past a low-water mark before the process
        # upstream of it writes again. So read until the decoder makes more; were it to stay
        # stopped, the records in buffers run out and the next read times out.
        while produced(trace) <= made:
            assert await lines.next() is not None, "the video ended, yet the decoder made no more"


async def test_a_client_that_hangs_up_cancels_the_work_upstream(video_stack, session, tmp_path):
    trace = tmp_path / "trace"
    response = await session.post(video_stack.url("streaming") + "/", json=video(400 * CHUNK_FRAMES, trace),
                                  headers={MODEL_ID_HEADER: "faces-v1"})
    assert response.status == 200, await response.text()
    await Lines(response).next()
    response.close()  # hang up after the first chunk
    # Router → orchestrator → its handle → decode's router → the decoder: all let go.
    await until(lambda: outcome(trace).startswith("stopped"))
    assert produced(trace) < 400
    for deployment in ("streaming", "decode", "detect", "encode"):
        async def idle():
            async with session.get(video_stack.url(deployment) + "/v1/replicas") as r:
                return all(replica["inflight"] == 0 for replica in (await r.json())["replicas"])
        await until(idle)
