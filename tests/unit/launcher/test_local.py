"""Local mode's supervisor: the restart backoff (pure, no processes) and the ports it plans."""

from __future__ import annotations

import socket

import pytest

from modelplex.processes import consecutive_free_ports, free_port, port_free
from modelplex.wire.spec import SpecError
from modelplex_launcher.local import HEALTHY_RUN_S, RESTART_BACKOFF_MAX_S, plan, restart_delay

from support.manifests import deployments_file


def crash_loop(runs: list[float]) -> list[float]:
    """The delays a child gets when it exits after running each of ``runs`` seconds in turn."""
    restarts, delays = 0, []
    for ran_s in runs:
        delay, restarts = restart_delay(restarts, ran_s)
        delays.append(delay)
    return delays


def test_a_crash_loop_backs_off_up_to_the_cap():
    assert crash_loop([0.5] * 8) == [1, 2, 4, 8, 16, RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_MAX_S]


def test_the_backoff_starts_over_after_a_healthy_run():
    # The case: a replica that ran healthy for 20 s between kills got 1, 2, 4 s.
    assert crash_loop([20.0, 20.0, 20.0]) == [1, 1, 1]
    assert crash_loop([0.5, 0.5, 0.5, HEALTHY_RUN_S, 0.5]) == [1, 2, 4, 1, 2]


def test_a_run_just_short_of_healthy_still_counts_as_a_crash():
    assert crash_loop([0.5, HEALTHY_RUN_S - 0.01]) == [1, 2]


def _manifests(folder, routers: dict[str, dict]) -> str:
    return deployments_file(folder, {name: {"router": router} for name, router in routers.items()})


def test_a_grpc_port_given_is_used_and_one_not_given_is_a_free_one(tmp_path):
    given = free_port()
    port = consecutive_free_ports(2)
    plans = plan([_manifests(tmp_path, {"a": {"grpcPort": given}, "b": {}})], host="127.0.0.1", port=port)
    assert plans[0].grpc_port == given
    assert plans[0].grpc_address == f"127.0.0.1:{given}"
    assert plans[1].grpc_port not in (given, port, port + 1) and port_free("127.0.0.1", plans[1].grpc_port)


@pytest.mark.parametrize("key", ["grpcPort", "controlPort"])
def test_a_grpc_or_control_port_in_use_is_an_error_that_names_it(tmp_path, key):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        with pytest.raises(SpecError, match=f"port {busy} on 127.0.0.1 is in use \\(spec.router.{key} of 'a'\\)"):
            plan([_manifests(tmp_path, {"a": {key: busy}})], host="127.0.0.1", port=consecutive_free_ports(1))


def test_a_grpc_port_that_is_another_router_s_http_port_is_an_error(tmp_path):
    port = consecutive_free_ports(2)
    with pytest.raises(SpecError, match=f"port {port + 1} \\(spec.router.grpcPort of 'a'\\) is another router's"):
        plan([_manifests(tmp_path, {"a": {"grpcPort": port + 1}, "b": {}})], host="127.0.0.1", port=port)


def test_a_control_port_given_is_used_and_one_not_given_is_a_free_one_apart_from_the_others(tmp_path):
    given = free_port()
    port = consecutive_free_ports(2)
    plans = plan([_manifests(tmp_path, {"a": {"controlPort": given}, "b": {}})], host="127.0.0.1", port=port)
    assert plans[0].control_port == given and plans[0].control_address == f"127.0.0.1:{given}"
    others = {given, port, port + 1, plans[0].grpc_port, plans[1].grpc_port}
    assert plans[1].control_port not in others and port_free("127.0.0.1", plans[1].control_port)


def test_no_two_planned_ports_are_the_same_even_when_a_draw_repeats_a_replica_s(tmp_path, monkeypatch):
    """Nothing holds a planned port until its process binds it: a later draw that hands out an
    earlier deployment's replica port again is drawn anew (it was a router's gRPC port, and the
    replica then could not bind)."""
    from modelplex_launcher import local

    singles = iter([36001, 36002, 35001, 36003, 36004, 36005, 36006])
    groups = iter([[35001], [35002]])
    monkeypatch.setattr(local, "free_port", lambda host="127.0.0.1": next(singles))
    monkeypatch.setattr(local, "free_ports", lambda count, host="127.0.0.1": next(groups))
    port = consecutive_free_ports(2)
    plans = plan([_manifests(tmp_path, {"a": {}, "b": {}})], host="127.0.0.1", port=port)
    ports = [p for plan_ in plans for p in (plan_.router_port, plan_.grpc_port, plan_.control_port, *plan_.replica_ports)]
    assert len(ports) == len(set(ports)), ports
    assert plans[1].grpc_port == 36003
