"""Small helpers for tests that run against the local control plane.

Polling and process checks are the core's (:mod:`modelplex.processes`), named here too so that
the e2e suite finds its helpers in one place.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from modelplex.processes import WaitTimeout, pid_alive, wait_for

__all__ = ["WaitTimeout", "http_get", "pid_alive", "wait_for"]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url`` (no proxies); returns (status, body). Connection errors raise OSError."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
