"""The router app's typed keys: what the app holds, by type."""

from __future__ import annotations

import asyncio
from typing import Callable

import aiohttp
from aiohttp import web

from modelplex_router.cold import ColdGate
from modelplex_router.config import RouterConfig
from modelplex_router.discovery.base import Discovery
from modelplex_router.metrics import RouterMetrics
from modelplex_router.proxy import Proxy
from modelplex_router.scheduler import Scheduler
from modelplex_router.table import RoutingTable

CONFIG = web.AppKey("config", RouterConfig)
TABLE = web.AppKey("table", RoutingTable)
SCHEDULER = web.AppKey("scheduler", Scheduler)
METRICS = web.AppKey("metrics", RouterMetrics)
DISCOVERY = web.AppKey("discovery", Discovery)
CLOCK = web.AppKey[Callable[[], float]]("clock")
SESSION = web.AppKey("session", aiohttp.ClientSession)
PROXY = web.AppKey("proxy", Proxy)
#: ``onCold`` and the load quota (:mod:`modelplex_router.cold`); made with the proxy.
COLD = web.AppKey("cold", ColdGate)
#: Set on SIGTERM: /readyz answers 503 while the requests in flight finish.
DRAINING = web.AppKey("draining", asyncio.Event)
