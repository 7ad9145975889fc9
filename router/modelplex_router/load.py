"""The router's load report for the autoscaler: ``GET /v1/load`` (:data:`modelplex.autoscaling.LOAD_PATH`).

It says what the scaler needs from this router (:class:`modelplex.autoscaling.LoadReport`):
the requests it has at each replica, the requests waiting in its queue (held at zero replicas
included), and each model's request rate over the last minute
(:class:`modelplex_router.demand.RequestRates`, kept by the scheduler).
"""

from __future__ import annotations

import os
import socket
import time

from aiohttp import web

from modelplex.autoscaling import LoadReport, ReplicaLoad
from modelplex.wire.names import ENV_POD_NAME
from modelplex_router.keys import CLOCK, CONFIG, SCHEDULER, TABLE

_ROUTER_NAME = os.environ.get(ENV_POD_NAME) or socket.gethostname()
#: The report names at most this many models' rates, the most requested: it stays small
#: (tens of kB) at thousands of models, and a model past them is as cold as a model can be.
MAX_REPORTED_MODELS = 1000


def load_report(app: web.Application) -> LoadReport:
    """This router's report, now."""
    scheduler = app[SCHEDULER]
    now = app[CLOCK]()
    usable = {r.name for r in app[TABLE].usable(now)}
    replicas = tuple(
        ReplicaLoad(name=r.name, ongoing=r.in_slots + sum(r.pending.values()), ready=r.name in usable,
                    models=tuple(sorted(r.all_models())), capacity=r.capacity)
        for r in sorted(app[TABLE].replicas(), key=lambda r: r.name)
    )
    return LoadReport(
        deployment=app[CONFIG].deployment,
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


async def load(request: web.Request) -> web.Response:
    """The load report the autoscaler reads."""
    return web.Response(body=load_report(request.app).to_json(), content_type="application/json")
