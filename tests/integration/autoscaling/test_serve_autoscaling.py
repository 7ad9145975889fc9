"""A Ray Serve application with ``autoscaling_config`` runs as written: at zero replicas until a
call, which waits while a replica starts and is answered by it."""

from __future__ import annotations

import torch

from modelplex import serve

from support.servers import descendants
from support.stacks import consecutive_free_ports


@serve.deployment(autoscaling_config={"min_replicas": 0, "max_replicas": 2, "upscale_delay_s": 1,
                                      "downscale_delay_s": 600, "metrics_interval_s": 1})
class Doubler:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(3, 3, bias=False)
        with torch.no_grad():
            self.model.weight.copy_(2 * torch.eye(3))

    async def __call__(self, values: list[float]) -> list[float]:
        with torch.no_grad():  # synchronous torch work inside async def, as users write it
            return self.model(torch.tensor(values)).tolist()


def replica_processes(pid: int) -> list[int]:
    found = []
    for child in descendants(pid):
        try:
            if b"replica" in open(f"/proc/{child}/cmdline", "rb").read().split(b"\0"):
                found.append(child)
        except OSError:
            continue
    return found


def test_serve_run_of_an_autoscaled_app_starts_at_zero_and_a_call_brings_a_replica():
    port = consecutive_free_ports(1)
    ingress = serve.run(Doubler.bind(), _port=port)
    try:
        local = serve.running._apps["default"].running.proc.pid
        assert replica_processes(local) == []  # min_replicas 0: nothing runs until a call
        assert serve.status().applications["default"].deployments["Doubler"].replica_states == {}
        assert ingress.remote([1.0, 2.0, 3.0]).result(120) == [2.0, 4.0, 6.0]
        assert len(replica_processes(local)) == 1
        # serve.status() reads the live count, as Ray's does (it said 1 throughout before).
        assert serve.status().applications["default"].deployments["Doubler"].replica_states == {"RUNNING": 1}
    finally:
        serve.shutdown()
