"""Local mode's ready file: what it lists, and that it is there only while the run serves (no processes started)."""

from __future__ import annotations

import io

from modelplex.processes import consecutive_free_ports
from modelplex.wire.ready import ReadyDeployment, read_ready_file
from modelplex_launcher.local import LocalRun, plan

from support.manifests import deployments_file


def _manifests(folder, replicas: dict[str, int]) -> str:
    return deployments_file(folder, {name: {"replicas": count} for name, count in replicas.items()})


def test_the_ready_file_lists_each_started_deployment_with_its_router_url_grpc_and_control_addresses(tmp_path):
    port = consecutive_free_ports(3)
    plans = plan([_manifests(tmp_path, {"alpha": 1, "idle": 0, "beta": 2})], host="127.0.0.1", port=port)
    run = LocalRun(plans, out=io.StringIO(), ready_file=tmp_path / "ready.json")
    try:
        run._write_ready_file()
        ready = read_ready_file(tmp_path / "ready.json")
    finally:
        run.shutdown()
    by_name = {p.deployment.name: p for p in plans}
    assert ready is not None
    assert ready.deployments == tuple(
        ReadyDeployment(name, by_name[name].router_url, by_name[name].grpc_address,
                        control=f"127.0.0.1:{by_name[name].control_port}") for name in ("alpha", "beta"))
    assert ready.control == {"alpha": f"127.0.0.1:{by_name['alpha'].control_port}",
                             "beta": f"127.0.0.1:{by_name['beta'].control_port}"}


def test_the_ready_file_is_removed_when_the_run_stops(tmp_path):
    run = LocalRun(plan([_manifests(tmp_path, {"alpha": 1})], host="127.0.0.1", port=consecutive_free_ports(1)),
                   out=io.StringIO(), ready_file=tmp_path / "ready.json")
    run._write_ready_file()
    assert (tmp_path / "ready.json").exists()
    run.shutdown()
    assert not (tmp_path / "ready.json").exists()
