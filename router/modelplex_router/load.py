"""The router's load report for the autoscaler: ``GET /v1/load`` (:data:`modelplex.wire.load.LOAD_PATH`).

It says what the scaler needs from this router (:class:`modelplex.wire.load.LoadReport`):
the requests it has at each replica, the requests waiting in its queue (held at zero replicas
included), and each model's request rate over the last minute
(:class:`modelplex_router.demand.RequestRates`, kept by the scheduler).
"""

from __future__ import annotations

import os
import socket
import time

from modelplex.wire.load import LoadReport, ReplicaLoad
from modelplex.wire.names import ENV_POD_NAME
from modelplex_router.scheduler import Scheduler
from modelplex_router.table import RoutingTable

_ROUTER_NAME = os.environ.get(ENV_POD_NAME) or socket.gethostname()
#: The report names at most this many models' rates, the most requested: it stays small
#: (tens of kB) at thousands of models, and a model past them is as cold as a model can be.
MAX_REPORTED_MODELS = 1000


def report(table: RoutingTable, scheduler: Scheduler, deployment: str, now: float) -> LoadReport:
    """The report of the router whose ``table`` and ``scheduler`` these are, at ``now``
    (:meth:`modelplex_router.router.Router.load_report`)."""
    usable = {r.name for r in table.usable(now)}
    replicas = tuple(
        ReplicaLoad(name=r.name, ongoing=r.in_slots + sum(r.pending.values()), ready=r.name in usable,
                    models=tuple(sorted(r.all_models())), capacity=r.capacity)
        for r in sorted(table.replicas(), key=lambda r: r.name)
    )
    return LoadReport(
        deployment=deployment,
        router=_ROUTER_NAME,
        at=time.time(),
        queued=scheduler.queued,
        replicas=replicas,
        model_rates=_most_requested(scheduler.demand.rates(now), MAX_REPORTED_MODELS),
        window_s=scheduler.demand.window_s,
    )


def _most_requested(rates: dict[str, float], limit: int) -> dict[str, float]:
    if len(rates) <= limit:
        return rates
    return dict(sorted(rates.items(), key=lambda item: -item[1])[:limit])
