"""The seeds' Ray Serve examples (examples/serve/) run with only their imports changed.

Each runs as a user runs it, ``python example.py``, in a network namespace of its own: the
examples call ``http://localhost:8000`` as Ray's do, and a namespace gives each run a loopback
where port 8000 is free, whatever else runs on this machine. ``serve.run`` starts
``modelplex local`` (replicas and routers as processes); the example's exit stops it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "serve"
RUN_TIMEOUT_S = 400  # a cold start of torch-importing processes on two shared cores

#: Runs an example as ``__main__`` (its folder first on the path, as ``python example.py`` has
#: it), then whatever checks follow (argv[2]) with its globals.
DRIVER = """
import os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
example = runpy.run_path(sys.argv[1], run_name="__main__")
exec(sys.argv[2], dict(example))
"""


#: Runs examples as a notebook's cells run, in one event loop (one cell per top-level statement,
#: as IPython runs them: a cell may ``await``, where a script calls ``asyncio.run(main())``).
NOTEBOOK_DRIVER = """
import ast, asyncio, inspect, os, sys

async def cells(paths):
    namespace = {"__name__": "__main__"}
    for path in paths:
        sys.path.insert(0, os.path.dirname(path))
        for statement in ast.parse(open(path).read(), path).body:
            if (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
                    and ast.unparse(statement.value.func) == "asyncio.run"):
                statement = ast.Expr(ast.Await(statement.value.args[0]))
            cell = ast.fix_missing_locations(ast.Module([statement], []))
            result = eval(compile(cell, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), namespace)
            if inspect.iscoroutine(result):
                await result

asyncio.run(cells(sys.argv[1:]))
"""


def run_example(name: str, checks: str = "") -> str:
    """The example's output (its deployments' too); fails with it when the example fails."""
    return run_isolated([sys.executable, "-c", DRIVER, str(EXAMPLES / name), checks], name)


def run_isolated(command: list[str], name: str, timeout_s: float = RUN_TIMEOUT_S) -> str:
    """``command``'s output, run in a network namespace of its own; fails with it when it fails."""
    proc = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{name} did not finish in {timeout_s:g} s:\n{output.decode(errors='replace')[-6000:]}")
    text = output.decode(errors="replace")
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{text[-6000:]}"
    # Issue 31, item 6: pooled connections left to the garbage collector at the end.
    assert "Unclosed" not in text, f"{name} left aiohttp sessions open:\n{text[-6000:]}"
    return text


def printed(output: str) -> list[str]:
    """What the example and its deployments printed, without the servers' logs. A log line may
    land mid-line on what a script prints (one stdout, several processes): it starts a line here."""
    output = re.sub(r"(?<!^)(?<!\n)(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} )", "\n", output)
    return [line for line in output.splitlines()
            if line and not re.match(r"\d{4}-\d\d-\d\d |modelplex local|  |\S+ is ready at|Press Ctrl-C", line)]


def test_simple_model_answers_a_method_called_by_name():
    assert "2" in printed(run_example("simple_model.py"))


def test_simple_batched_model_answers_eight_calls_in_order_in_batches_of_at_most_four():
    output = run_example("simple_batched_model.py")
    # The replica's prints and the script's share one stdout: a line of one may end on a line of
    # the other ("all eight answers in ordermultiple_samples=[4, 5, 6, 7]"), so search, not split.
    text = "\n".join(printed(output))
    batches = [ast.literal_eval(batch) for batch in re.findall(r"multiple_samples=(\[[^\]]*\])", text)]
    assert sorted(sample for batch in batches for sample in batch) == list(range(8)), output
    assert all(1 <= len(batch) <= 4 for batch in batches), batches
    assert len(batches) < 8, f"eight calls sent at once were not batched: {batches}"
    assert "all eight answers in order" in text


def test_the_examples_run_cell_by_cell_in_one_event_loop_as_a_notebook_runs_them():
    """Issue 31, item 1: in a notebook, a second serve.run's first call was lost (call 0 of the
    batching example: batches [1, 2, 3, 4], [5, 6, 7]). Here every example runs, each replacing
    the one before, cell by cell in one event loop, as a notebook's cells run them."""
    names = ["simple_model.py", "simple_batched_model.py", "model_server.py", "composition.py",
             "optimized_pipeline.py", "video_naive.py", "video_streaming.py"]
    output = run_isolated([sys.executable, "-c", NOTEBOOK_DRIVER, *(str(EXAMPLES / name) for name in names)],
                          "the notebook", timeout_s=RUN_TIMEOUT_S * 3)
    lines = printed(output)
    text = "\n".join(lines)
    assert "2" in lines, output  # the simple model's answer
    batches = [ast.literal_eval(batch) for batch in re.findall(r"multiple_samples=(\[[^\]]*\])", text)]
    assert sorted(sample for batch in batches for sample in batch) == list(range(8)), output
    assert all(1 <= len(batch) <= 4 for batch in batches), batches
    for expected in ("all eight answers in order", "prediction from model_v1", "prediction from model_v2",
                     "prediction from model_v3", "200 bar", "16 answers match their models",
                     "60 frames in 1 chunk(s), 60 with a box on the face",
                     "60 frames in 3 chunk(s), 60 with a box on the face"):
        assert expected in text, f"{expected!r} missing:\n{output[-6000:]}"


def test_model_server_evicts_model_v1_for_model_v3_over_the_handle_and_http():
    # The answer for model_v3 announces a new loaded-models version; the router fetches the
    # replica's document after relaying it, so the table may lag the example by a few ms.
    checks = """
import json, time, urllib.request
deadline = time.monotonic() + 10
while True:
    table = json.loads(urllib.request.urlopen("http://127.0.0.1:8000/v1/replicas").read())
    if "model_v1" not in table["replicas"][0]["models"] or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print("REPLICAS " + json.dumps(table))
print("AGAIN " + handle.options(multiplexed_model_id="model_v1").remote({"simple": "request"}).result(60))
"""
    output = run_example("model_server.py", checks)
    lines = printed(output)
    # The replica's log lines share the script's stdout and may land mid-line: search, not split.
    assert re.findall(r"loading model_id='model_v\d' from blob store|(?<!AGAIN )prediction from model_v\d", output) == [
        "loading model_id='model_v1' from blob store", "prediction from model_v1",
        "loading model_id='model_v2' from blob store", "prediction from model_v2",
        "loading model_id='model_v3' from blob store", "prediction from model_v3",
        "loading model_id='model_v1' from blob store",  # evicted: loaded again
    ], output
    table = json.loads(next(line for line in lines if line.startswith("REPLICAS "))[len("REPLICAS "):])
    # After model_v3, before model_v1 again: the router saw the replica drop model_v1.
    assert [sorted(replica["models"]) for replica in table["replicas"]] == [["model_v2", "model_v3"]], table
    assert "AGAIN prediction from model_v1" in lines


def test_upstream_calls_its_multiplexed_downstream_through_the_handle_it_was_built_with():
    output = run_example("composition.py")
    assert "200 bar" in printed(output), output


def test_optimized_pipeline_batches_per_model_and_answers_each_request_with_its_own_model():
    assert "16 answers match their models" in printed(run_example("optimized_pipeline.py"))


def expected_video_digest(tmp_path: Path) -> str:
    """The digest of the boxed video, computed here with the stages' own functions."""
    spec = importlib.util.spec_from_file_location("video_stages_here", EXAMPLES / "video_stages.py")
    stages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stages)
    stages.make_video(tmp_path / "input.video", frames=60)
    frames = stages.read_frames(tmp_path / "input.video", 0, 60)
    return stages.digest(stages.draw_boxes(frames, stages.FaceDetector()(frames)))


def _video(output: str) -> tuple[str, str]:
    lines = printed(output)
    summary = next((line for line in lines if " frames in " in line), None)
    video = next((line for line in lines if line.startswith("video digest ")), None)
    assert summary and video, output
    return summary, video


def test_the_naive_video_orchestrator_decodes_then_detects_and_encodes_the_whole_video_in_one_call(tmp_path):
    summary, video = _video(run_example("video_naive.py"))
    assert summary == "60 frames in 1 chunk(s), 60 with a box on the face"
    assert video == "video digest " + expected_video_digest(tmp_path)


def test_the_streaming_orchestrator_sends_each_decoded_batch_on_as_a_reference_and_gets_the_same_video(tmp_path):
    output = run_example("video_streaming.py")
    summary, video = _video(output)
    assert summary == "60 frames in 3 chunk(s), 60 with a box on the face"  # one per batch of 20
    assert [line for line in printed(output) if line.startswith("decoded frames")] == [
        "decoded frames 0-19", "decoded frames 20-39", "decoded frames 40-59"]
    assert video == "video digest " + expected_video_digest(tmp_path)
