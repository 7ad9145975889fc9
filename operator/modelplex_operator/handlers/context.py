"""The operator's shared state, created at startup and kept in kopf's ``memo``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modelplex_operator.builders import BuildSettings
from modelplex_operator.config import OperatorConfig
from modelplex_operator.status import Outcome

if TYPE_CHECKING:  # pragma: no cover
    from modelplex_operator.handlers.keeper import StatusKeeper
    from modelplex_operator.kube import Kube

Key = tuple[str, str]  # (namespace, name) of a MultiplexedDeployment

MEMO_KEY = "modelplex"


@dataclass
class OperatorContext:
    config: OperatorConfig
    kube: Kube
    keeper: StatusKeeper | None = None
    outcomes: dict[Key, Outcome] = field(default_factory=dict)
    _locks: dict[Key, asyncio.Lock] = field(default_factory=dict)

    @property
    def build_settings(self) -> BuildSettings:
        return BuildSettings(router_image=self.config.router_image, image_pull_policy=self.config.image_pull_policy)

    def lock(self, key: Key) -> asyncio.Lock:
        """Serialises the applies of one resource (the reconcile handler and the keeper's repairs)."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def record(self, key: Key, outcome: Outcome) -> None:
        self.outcomes[key] = outcome

    def forget(self, key: Key) -> None:
        self.outcomes.pop(key, None)
        lock = self._locks.get(key)
        if lock is not None and not lock.locked():
            del self._locks[key]


def context_of(memo: Any) -> OperatorContext:
    """The context the startup handler put into kopf's memo."""
    ctx = memo.get(MEMO_KEY) if hasattr(memo, "get") else getattr(memo, MEMO_KEY, None)
    if ctx is None:
        raise RuntimeError("the operator context is missing from kopf's memo (did the startup handler run?)")
    return ctx
