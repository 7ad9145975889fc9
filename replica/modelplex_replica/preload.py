"""Pre-loading the hottest models before the replica reports ready.

A replica the autoscaler adds would otherwise answer its first requests for the popular models
with loads. The scaler keeps a file of the hottest models (one id a line, hottest first:
:func:`modelplex.wire.load.format_hot_models`) and names it in ``MODELPLEX_PRELOAD_FILE``: in
a pod, a ConfigMap key mounted as a file; in local mode, a file local mode writes. At start,
after ``spec.multiplexing.prewarm``, the replica loads the listed models it has room for (its
``maxModelsPerReplica``), then turns ready. A missing or unreadable file, or a failing load,
is logged and skipped: pre-loading only saves time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

from modelplex.cache import ModelCache
from modelplex.wire.load import ENV_PRELOAD_FILE, parse_hot_models

log = logging.getLogger("modelplex.replica")


def hot_models(env: Mapping[str, str] = os.environ) -> list[str]:
    """The ids in the pre-load file, hottest first; [] when there is none."""
    path = env.get(ENV_PRELOAD_FILE)
    if not path:
        return []
    try:
        return parse_hot_models(Path(path).read_text())
    except FileNotFoundError:
        return []  # the scaler has not written it yet: nothing is hot
    except OSError as error:
        log.warning("cannot read the pre-load file %s (%s): no model pre-loaded", path, error.strerror)
        return []


def to_preload(cache: ModelCache, listed: list[str]) -> list[str]:
    """The listed models not held yet, as many as the cache has room for."""
    room = cache.capacity - len(cache.loaded) - len(cache.loading)
    return [m for m in listed if m not in cache and m not in cache.loading][:max(0, room)]


async def preload(cache: ModelCache, listed: list[str]) -> tuple[list[str], dict[str, str]]:
    """On the user loop (the cache's own): load what fits of ``listed``; the models it tried and
    the errors by model id."""
    models = to_preload(cache, listed)
    results: list[Any] = await asyncio.gather(*(cache.get(m) for m in models), return_exceptions=True)
    return models, {m: str(r) for m, r in zip(models, results) if isinstance(r, BaseException)}


async def preload_hot_models(cache: ModelCache | None, env: Mapping[str, str] = os.environ) -> None:
    """Read the pre-load file and load what fits (on the user loop, the cache's own)."""
    listed = hot_models(env)
    if not listed or cache is None:
        return
    started = time.monotonic()
    models, errors = await preload(cache, listed)
    for model, error in errors.items():
        log.warning("pre-loading hot model %r failed: %s", model, error)
    if models:
        log.info("pre-loaded %d of %d hot model(s) in %.3f s: %s", len(models) - len(errors), len(listed),
                 time.monotonic() - started, ", ".join(models))
