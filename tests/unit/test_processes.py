"""modelplex.processes on real processes: groups, death with the parent, stopping, polling."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys

import pytest

from modelplex.processes import (ProcessExited, WaitTimeout, consecutive_free_ports, descendants, free_port, free_ports,
                                 pid_alive, port_free, running, spawn, stop, wait_for, wait_for_async)

#: A shell that starts a child of its own and waits on it: a group of two.
PARENT_OF_ONE = ["sh", "-c", "tail -f /dev/null & echo started; wait"]


def test_a_child_leads_a_group_of_its_own_and_appends_to_its_log(tmp_path):
    log = tmp_path / "logs" / "child.log"
    log.parent.mkdir()
    log.write_text("before\n")
    proc = spawn([sys.executable, "-c", "import os, sys; print(os.getpgid(0), sys.stdin.read() == '')"], log=log)
    assert proc.wait(timeout=30) == 0
    assert log.read_text() == f"before\n{proc.pid} True\n"  # its own group; stdin is /dev/null


def test_a_piped_childs_output_and_errors_are_read_from_its_stdout():
    script = "import os, sys; print(os.getpgid(0), flush=True); print('oops', file=sys.stderr)"
    proc = spawn([sys.executable, "-c", script], pipe=True)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and output.decode().split() == [str(proc.pid), "oops"]


def test_stop_ends_the_whole_group_and_returns_the_exit_code(tmp_path):
    proc = spawn(PARENT_OF_ONE, log=tmp_path / "log")
    wait_for(lambda: (tmp_path / "log").read_text() == "started\n", timeout=30, interval=0.01)
    (grandchild,) = wait_for(lambda: descendants(proc.pid), timeout=30, interval=0.01)
    assert stop(proc, grace=10) == -signal.SIGTERM
    wait_for(lambda: not pid_alive(grandchild), timeout=10, interval=0.01, what="the grandchild gone")


def test_stop_kills_a_child_that_ignores_its_signal_after_the_grace(tmp_path):
    proc = spawn(["sh", "-c", "trap '' TERM; echo ready; tail -f /dev/null"], log=tmp_path / "log")
    wait_for(lambda: (tmp_path / "log").read_text() == "ready\n", timeout=30, interval=0.01)
    assert stop(proc, grace=0.2) == -signal.SIGKILL


def test_a_child_dies_with_the_process_that_spawned_it(tmp_path):
    # A middle process spawns a grandchild the shared way, says its pid, and is SIGKILLed: no
    # goodbye, and still the grandchild gets its death signal.
    middle = subprocess.Popen(
        [sys.executable, "-c", "import sys; from modelplex.processes import spawn\n"
         "child = spawn(['tail', '-f', '/dev/null'])\nprint(child.pid, flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(middle.stdout.readline())
        assert pid_alive(grandchild)
        middle.kill()
        middle.wait(timeout=10)
        wait_for(lambda: not pid_alive(grandchild), timeout=10, interval=0.01, what="the orphan gone")
    finally:
        middle.kill()
        middle.wait(timeout=10)


def test_running_names_the_exit_code_and_the_end_of_the_log(tmp_path):
    log = tmp_path / "log"
    proc = spawn(["sh", "-c", "echo 'cannot bind: address in use'; exit 3"], log=log)
    proc.wait(timeout=30)
    with pytest.raises(ProcessExited, match=r"(?s)replica exited with code 3; log: .*cannot bind: address in use"):
        running(proc, "replica", log)


def test_free_ports_are_distinct_and_free_and_a_listened_port_is_not():
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(port_free("127.0.0.1", port) for port in ports)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        assert not port_free("127.0.0.1", listener.getsockname()[1])


def test_wait_for_returns_the_first_truthy_value_and_counts_errors_as_not_yet():
    answers = iter([ConnectionRefusedError("not yet"), 0, None, {"ready": 2}])

    def check():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(check, timeout=10, interval=0) == {"ready": 2}


def test_wait_for_gives_up_naming_what_and_the_last_error():
    def check():
        raise ConnectionRefusedError("port 8000")

    with pytest.raises(WaitTimeout, match=r"waiting for the router; last: ConnectionRefusedError\('port 8000'\)"):
        wait_for(check, timeout=0, interval=0, what="the router")


def test_an_error_outside_retry_on_and_a_guard_end_the_wait_at_once():
    with pytest.raises(KeyError):
        wait_for(lambda: {}["missing"], timeout=60, retry_on=(OSError,))
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=30)
    with pytest.raises(ProcessExited, match="router exited with code 0"):
        wait_for(lambda: False, timeout=60, guard=lambda: running(dead, "router"))


@pytest.mark.looptime
async def test_wait_for_async_is_timed_by_the_event_loops_clock():
    loop = asyncio.get_running_loop()
    start = loop.time()
    tries = 0

    async def check():
        nonlocal tries
        tries += 1
        return tries == 3 and "ready"

    assert await wait_for_async(check, timeout=60, interval=5) == "ready"
    assert await wait_for_async(lambda: tries, timeout=60) == 3  # a plain function will do too
    assert loop.time() - start == pytest.approx(10)
    async def never() -> bool:
        return False

    with pytest.raises(WaitTimeout, match="timed out after 60 s waiting for nothing; last: False"):
        await wait_for_async(never, timeout=60, interval=1, what="nothing")
    assert loop.time() - start == pytest.approx(70)


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    # Outgoing connections take their source ports from the ephemeral range: a port handed out
    # from there could be taken before the server binds it.
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = free_ports(20)
    assert len(set(ports)) == 20 and all(p < low for p in ports), (ports, low)
    assert all(port_free("127.0.0.1", p) for p in ports)


def test_a_port_handed_out_is_not_handed_out_again_before_its_server_listens():
    # The servers these ports are for start later, so each port is still free at the next draw:
    # 3,000 draws from ~22,000 ports would repeat one almost surely if nothing remembered them.
    first = consecutive_free_ports(4)
    singles = [free_port() for _ in range(3000)]
    assert len(set(singles)) == len(singles)
    assert not set(singles) & set(range(first, first + 4))
