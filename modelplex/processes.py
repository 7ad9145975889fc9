"""Child processes that never outlive their parent, and waiting for things to become true.

One place for what local mode, the cluster tooling, the tests and the benchmarks all do:

- :func:`spawn` starts a child in a process group of its own (a Ctrl-C in the terminal reaches
  only the parent, and :func:`stop` reaches everything the child started) that gets a signal
  should the parent die, however it dies (Linux ``PR_SET_PDEATHSIG``);
- :func:`stop` ends a child's group by its pid: a signal, a grace period, then SIGKILL;
- :func:`wait_for` / :func:`wait_for_async` poll a check until it holds, bounded in time, and
  :func:`running` turns an exited child into an error naming its exit code and log;
- ports: :func:`free_port`, :func:`free_ports`, :func:`consecutive_free_ports`, :func:`port_free`;
  processes: :func:`pid_alive`, :func:`descendants`.

Standard library only: every component may use it.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: stop() still reaches the whole group
    _prctl = None


class WaitTimeout(TimeoutError):
    """What :func:`wait_for` waited for did not come true in time; the message says what and
    the last value or error the check gave."""


class ProcessExited(RuntimeError):
    """A child that should be running has exited."""


# --------------------------------------------------------------------------- children


def die_with_parent(death_signal: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``death_signal`` when the thread that spawned it dies."""

    def setup() -> None:  # in the child, before exec
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)

    return setup


def spawn(
    argv: Sequence[str],
    *,
    log: Path | None = None,
    pipe: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    death_signal: int | None = signal.SIGTERM,
) -> subprocess.Popen:
    """Start ``argv`` in a process group of its own, stdin from /dev/null, its output appended
    to ``log``, or with ``pipe`` read from ``proc.stdout`` (else this process's own). The child
    gets ``death_signal`` when the thread that spawned it dies (None: it may outlive it, as a
    daemon does)."""
    if pipe:
        return _popen(argv, subprocess.PIPE, env, cwd, death_signal)
    if log is None:
        return _popen(argv, None, env, cwd, death_signal)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        return _popen(argv, output, env, cwd, death_signal)


def _popen(argv, output, env, cwd, death_signal) -> subprocess.Popen:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=True,  # its own group, whose id is its pid
        preexec_fn=die_with_parent(death_signal) if death_signal is not None else None,
    )


def signal_group(pid: int, sig: int) -> bool:
    """Send ``sig`` to the process group led by ``pid`` (a :func:`spawn` ed child's); False when
    nothing was there to get it."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop(proc: subprocess.Popen, *, grace: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
    """Stop a :func:`spawn` ed child and everything in its group: ``sig``, up to ``grace``
    seconds for the child to exit, then SIGKILL for whatever is left in the group. Returns the
    child's exit code (None if even SIGKILL did not end it within 5 s)."""
    if proc.poll() is None:
        signal_group(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc.pid, signal.SIGKILL)  # the child, if it is still there, and its stragglers
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def running(proc: subprocess.Popen, name: str, log: Path | None = None) -> None:
    """Raise :class:`ProcessExited` (with the end of ``log``) if ``proc`` has exited."""
    code = proc.poll()
    if code is not None:
        where = f"; log: {log}\n{log_tail(log)}" if log is not None else ""
        raise ProcessExited(f"{name} exited with code {code}{where}")


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log ("(no log)" when it cannot be read)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


# --------------------------------------------------------------------------- ports


#: Where the kernel takes the source ports of outgoing connections (Linux's default, if unreadable).
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10000
# Ports this process handed out lately, oldest first. A caller often draws a port and starts a
# server on it only later, so a later draw could find that port still free and hand it out twice.
_handed_out: dict[int, None] = {}
_HANDED_OUT_KEPT = 4096
_handed_out_lock = threading.Lock()


def _hand_out(ports: Sequence[int]) -> None:
    with _handed_out_lock:
        for port in ports:
            _handed_out[port] = None
        while len(_handed_out) > _HANDED_OUT_KEPT:
            del _handed_out[next(iter(_handed_out))]


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports nothing listens on now (all held open until all are found).

    They are drawn below the kernel's ephemeral range: a port from that range (what binding port 0
    gives) can be taken as the source port of any outgoing connection on the machine between this
    call and the server's own bind, which then fails with "address already in use". Nor is a port
    this process handed out lately handed out again: its server may not be listening yet."""
    low = _ephemeral_low()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count * 50):
            if len(sockets) == count:
                break
            port = random.randrange(_LOWEST_PORT, low) if low - _LOWEST_PORT >= 1000 else 0
            if port in _handed_out:
                continue
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        if len(sockets) < count:
            raise OSError(f"no {count} free ports on {host}")
        ports = [sock.getsockname()[1] for sock in sockets]
        _hand_out(ports)
        return ports
    finally:
        for sock in sockets:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now."""
    return free_ports(1, host)[0]


def consecutive_free_ports(count: int, host: str = "127.0.0.1") -> int:
    """A port P with P .. P+count-1 all free now (local mode puts routers on consecutive ports)."""
    for _ in range(100):
        first = free_port(host)
        rest = range(first + 1, first + count)
        if first + count <= 65536 and all(port not in _handed_out and port_free(host, port) for port in rest):
            _hand_out(rest)
            return first
    raise OSError(f"no {count} consecutive free ports on {host}")


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` can be listened on now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------- waiting


class _Poll:
    """One wait's bookkeeping, shared by the blocking and the async loop: the guard before each
    try, an error of ``retry_on`` taken as "not yet", and the timeout after a try that found nothing."""

    def __init__(self, timeout: float, what: str, clock: Callable[[], float],
                 guard: Callable[[], object] | None) -> None:
        self.timeout, self.what, self.clock, self.guard = timeout, what, clock, guard
        self.at = clock() + timeout
        self.last: object = None

    def before(self) -> None:
        if self.guard is not None:
            self.guard()

    def found(self, value: object) -> bool:
        """Whether ``value`` (a result, or the error a try raised) ends the wait; raises
        :class:`WaitTimeout` when it does not and the time is up."""
        if value and not isinstance(value, BaseException):
            return True
        self.last = value
        if self.clock() >= self.at:
            raise WaitTimeout(f"timed out after {self.timeout:g} s waiting for {self.what}; last: {self.last!r}")
        return False


def wait_for(check: Callable[[], T], timeout: float = 60.0, interval: float = 0.25, what: str = "", *,
             retry_on: tuple[type[BaseException], ...] = (Exception,), guard: Callable[[], object] | None = None) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something truthy, and return
    that. An exception of ``retry_on`` counts as "not yet"; ``guard`` runs before each try and
    what it raises ends the wait (say, :func:`running` of the child being waited for). After
    ``timeout`` seconds: :class:`WaitTimeout`, naming ``what`` and the last value or error."""
    poll = _Poll(timeout, what or repr(check), time.monotonic, guard)
    while True:
        poll.before()
        try:
            value = check()
        except retry_on as error:
            poll.found(error)
        else:
            if poll.found(value):
                return value
        time.sleep(interval)


async def wait_for_async(check: Callable[[], Awaitable[T] | T], timeout: float = 60.0, interval: float = 0.05,
                         what: str = "", *, retry_on: tuple[type[BaseException], ...] = (Exception,),
                         guard: Callable[[], object] | None = None) -> T:
    """:func:`wait_for` on an event loop: ``check`` may be a coroutine function or a plain one;
    the pauses are the loop's, timed by its clock (a test on a virtual clock waits no real time)."""
    poll = _Poll(timeout, what or repr(check), asyncio.get_running_loop().time, guard)
    while True:
        poll.before()
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except retry_on as error:
            poll.found(error)
        else:
            if poll.found(value):
                return value
        await asyncio.sleep(interval)
