"""The HTTP front's one typed key: the :class:`~modelplex_router.router.Router` it serves."""

from __future__ import annotations

from aiohttp import web

from modelplex_router.router import Router

ROUTER = web.AppKey("router", Router)
