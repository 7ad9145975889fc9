"""Small helpers for tests that run against the local control plane."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from typing import Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_for(check: Callable[[], T], timeout: float = 60.0, interval: float = 0.25, what: str = "") -> T:
    """Call ``check`` until it returns something truthy; raise WaitTimeout (an AssertionError) after
    ``timeout`` seconds, naming ``what`` and the last value or exception."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last error
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what or check!r}; last: {last!r}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True when the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url`` (no proxies); returns (status, body). Connection errors raise OSError."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
