"""Ray Serve side of the comparison: the thin adapter, and the driver process that runs Ray.

The adapter is all that differs from Modelplex: the handler classes come from
``handlers.build(ray.serve)``; a subclass takes Ray's starlette ``Request``, reads its JSON and
calls the same ``__call__`` (Ray itself reads the ``serve_multiplexed_model_id`` header for
routing and for ``get_multiplexed_model_id``). Answers are encoded with orjson, as Modelplex's
replica does, so JSON encoding is not what is compared; streams are NDJSON, as Modelplex's.

Run as a process (``python ray_app.py --port P``), it starts a lean local Ray (``num_cpus``
2, no dashboard), Serve's HTTP proxy on 127.0.0.1:P, and takes one JSON command per stdin line:

    {"op": "deploy", "workload": "BatchedMLP", "env": {...}, "options": {...}}  -> {"ok": true}
    {"op": "delete"}                                                            -> {"ok": true}
    {"op": "quit"} (or end of input)   -> serve.shutdown(); ray.shutdown(); exit

Answers go to stdout, one JSON line each; Ray's own chatter goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
APP_NAME = "bench"
STREAMING = {"Streamer", "BusyStreamer"}  # the handlers that are async generators


def adapt(cls, *, streaming: bool):
    """``cls`` with Ray's HTTP calling convention: Request in, Response out."""
    import orjson
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse

    class RayAdapter(cls):
        def __init__(self, env: dict[str, str]):
            os.environ.update(env)  # the BENCH_* settings, as Modelplex replicas get them
            super().__init__()

        async def __call__(self, request: Request):
            body = orjson.loads(await request.body())
            if streaming:
                chunks = super().__call__(body)

                async def ndjson():
                    async for chunk in chunks:
                        yield orjson.dumps(chunk) + b"\n"

                return StreamingResponse(ndjson(), media_type="application/x-ndjson")
            result = await super().__call__(body)
            return Response(orjson.dumps(result), media_type="application/json")

    RayAdapter.__name__ = RayAdapter.__qualname__ = cls.__name__
    return RayAdapter


def deployment(workload: str, options: dict):
    from handlers import build
    from ray import serve

    cls = getattr(build(serve), workload)
    return serve.deployment(name=workload, **options)(adapt(cls, streaming=workload in STREAMING))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--num-gpus", type=int, default=None)
    args = parser.parse_args()

    out = sys.stdout
    sys.stdout = sys.stderr  # Ray prints; only our answers go to the real stdout

    def answer(**fields) -> None:
        out.write(json.dumps(fields) + "\n")
        out.flush()

    import ray
    from ray import serve

    # Workers import `handlers` from this folder (they inherit the raylet's environment).
    os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, HERE)
    started = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, num_gpus=args.num_gpus, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    answer(ok=True, op="start", seconds=round(time.perf_counter() - started, 3), ray=ray.__version__)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            op = command.get("op")
            try:
                if op == "deploy":
                    t0 = time.perf_counter()
                    app = deployment(command["workload"], command.get("options", {})).bind(command.get("env", {}))
                    serve.run(app, name=APP_NAME, route_prefix="/")
                    answer(ok=True, op=op, seconds=round(time.perf_counter() - t0, 3))
                elif op == "delete":
                    serve.delete(APP_NAME)
                    answer(ok=True, op=op)
                elif op == "quit":
                    break
                else:
                    answer(ok=False, op=op, error="unknown op")
            except Exception as error:  # noqa: BLE001 - reported to the orchestrator
                answer(ok=False, op=op, error=f"{type(error).__name__}: {error}")
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    answer(ok=True, op="quit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
