"""A router stopping (SIGTERM) takes no new gRPC calls but lets a stream in flight finish, within
``spec.gracefulShutdownTimeoutSeconds``, as its HTTP side does."""

from __future__ import annotations

import os
import queue
import shutil
import signal
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from modelplex.processes import free_ports, wait_for

from support.servers import MODELPLEX, Processes
from support.stacks import manifest, write_documents

HERE = Path(__file__).resolve().parent
WAIT_S = 120.0


def answers_refused(address: str) -> bool:
    with triton.InferenceServerClient(address) as fresh:
        try:
            fresh.is_server_live(client_timeout=5)
        except InferenceServerException:
            return True
    return False


def test_a_stream_in_flight_at_sigterm_finishes_and_new_calls_are_refused(tmp_path):
    processes = Processes(tmp_path)
    try:
        shutil.copy(HERE / "handlers.py", tmp_path / "handlers.py")
        path = write_documents(tmp_path / "countdown.yaml", [manifest("countdown", "handlers:Countdown")])
        replica = processes.replica(path)
        http_port, grpc_port = free_ports(2)
        router = processes.start("router", [*MODELPLEX, "router", "--spec", str(path), "--host", "127.0.0.1",
                                            "--port", str(http_port), "--grpc-port", str(grpc_port),
                                            "--replica", replica.url])
        address = f"127.0.0.1:{grpc_port}"
        answers: queue.Queue = queue.Queue()
        gate = tmp_path / "gate"
        with triton.InferenceServerClient(address) as client:
            wait_for(lambda: client.is_server_ready(client_timeout=5), WAIT_S, 0.1, "the router's gRPC ServerReady",
                     guard=router.check_running)
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            try:
                start = triton.InferInput("start", [1], "INT32")
                start.set_data_from_numpy(np.array([2], dtype=np.int32))
                gated = triton.InferInput("gate", [1], "BYTES")
                gated.set_data_from_numpy(np.array([str(gate).encode()], dtype=object))
                client.async_stream_infer("any", [start, gated], request_id="s", enable_empty_final_response=True)
                first, error = answers.get(timeout=WAIT_S)
                assert error is None and first.as_numpy("step").tolist() == [2]
                os.kill(router.popen.pid, signal.SIGTERM)  # the stream's next step waits for its gate
                wait_for(lambda: answers_refused(address), 30, 0.1, "the stopping router refusing new calls")
                Path(f"{gate}.1").touch()
                rest = [answers.get(timeout=WAIT_S) for _ in range(2)]
            finally:
                client.stop_stream()
        assert [e for _, e in rest] == [None, None]
        assert rest[0][0].as_numpy("step").tolist() == [1]
        assert rest[1][0].get_response().parameters["triton_final_response"].bool_param
        assert router.popen.wait(timeout=30) == 0, router.tail()  # its grace is 20 s
    finally:
        processes.stop_all()
