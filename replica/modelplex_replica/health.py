"""The handler's own health check (Ray Serve's ``check_health``), run where user code runs.

A handler with a ``check_health`` method (sync or ``async def``) has it called every
``spec.healthCheck.periodSeconds`` on the user-code loop (a sync one in a worker thread); the
control port answers the probes from the last result at once, so a replica busy computing is
not unhealthy for it. A check that raises, or does not answer within ``timeoutSeconds``, makes
the replica not ready (``/readyz`` 503 naming why: the routers send it nothing) until one
passes; ``failureThreshold`` failures in a row fail ``/healthz`` too, and the kubelet restarts
the pod, as Ray restarts an unhealthy replica.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable

from modelplex.wire.spec import HealthCheck

log = logging.getLogger("modelplex.replica")


@dataclass
class Health:
    """The last results of the handler's check, read by the probes (from either loop)."""

    #: Failed checks in a row (0: the last passed, or none ran yet).
    failures: int = 0
    #: Why the last check failed.
    reason: str = ""

    def passed(self) -> None:
        if self.failures:
            log.info("check_health passes again after %d failure(s)", self.failures)
        self.failures, self.reason = 0, ""

    def failed(self, reason: str) -> None:
        self.failures += 1
        self.reason = reason
        log.warning("check_health failed (%d in a row): %s", self.failures, reason)


def health_check_of(handler: Any) -> Callable[[], Any] | None:
    """The handler's ``check_health``, if it has one."""
    check = getattr(handler, "check_health", None)
    return check if callable(check) else None


async def check_once(check: Callable[[], Any], health: Health, timeout_s: float) -> None:
    """Run ``check`` once within ``timeout_s`` and record the result."""
    try:
        if inspect.iscoroutinefunction(check):
            await asyncio.wait_for(check(), timeout_s)
        else:  # a blocking check: a worker thread (it cannot be interrupted: its result is waited for no longer)
            await asyncio.wait_for(asyncio.to_thread(check), timeout_s)
    except TimeoutError:
        health.failed(f"check_health did not answer within {timeout_s:g} s")
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's check: its failure is the result
        health.failed(f"check_health raised {type(error).__name__}: {error}")
    else:
        health.passed()


async def run_checks(check: Callable[[], Any], health: Health, config: HealthCheck) -> None:
    """Check every ``periodSeconds`` until cancelled (the first after one period, as Ray does)."""
    while True:
        await asyncio.sleep(config.period_seconds)
        await check_once(check, health, config.timeout_seconds)
