"""Pinning models on this replica (``POST /v1/pins``, :mod:`modelplex.wire.pins`), on the user
loop where the cache lives: lease the ids, then load those not loaded, in the background or,
when asked, before answering."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from modelplex.cache import ModelCache
from modelplex.wire.pins import PinRequest

log = logging.getLogger("modelplex.replica")

#: Loads a pin started and nobody awaits: held so that they are not collected mid-way.
_BACKGROUND: set[asyncio.Task] = set()


async def pin(cache: ModelCache, request: PinRequest) -> dict[str, Any]:
    """Lease ``request.models`` and load the ones not loaded; the answer: the leases, what is
    loaded and loading, and (with ``wait``) the loads that failed, by id."""
    cache.lease(request.models, request.ttl_s)
    loads = {model: asyncio.ensure_future(cache.get(model)) for model in request.models if model not in cache}
    errors: dict[str, str] = {}
    if request.wait:
        results = await asyncio.gather(*loads.values(), return_exceptions=True)
        errors = {model: str(result) for model, result in zip(loads, results) if isinstance(result, BaseException)}
    else:
        for model, task in loads.items():
            _BACKGROUND.add(task)
            task.add_done_callback(functools.partial(_loaded, model=model))
    return {
        "pinned": {model: round(left, 3) for model, left in sorted(cache.leases.items())},
        "loaded": [model for model in request.models if model in cache],
        "loading": [model for model in request.models if model in cache.loading],
        "errors": errors,
    }


def _loaded(task: asyncio.Task, model: str) -> None:
    _BACKGROUND.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("loading pinned model %r failed: %s", model, task.exception())
