"""The operator's shared state: settings, client, the latest indexes, and what the reconcile
handler and the autoscaler decided, per resource. Built at startup (:mod:`.lifecycle`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from modelplex.wire.names import ROLE_REPLICA
from modelplex_operator.builders import BuildSettings
from modelplex_operator.config import OperatorConfig
from modelplex_operator.credentials import InternalCredentials
from modelplex_operator.handlers.observe import Indexes
from modelplex_operator.kube import Kube
from modelplex_operator.pods import PodClient
from modelplex_operator.pools import InferencePools
from modelplex_operator.status import Key, Outcome


@dataclass
class OperatorContext:
    """What the handlers, the status keeper and the autoscaler share (one per operator process)."""

    config: OperatorConfig
    kube: Kube
    #: kopf's indexes as the last handler call saw them (None until the first one).
    indexes: Indexes | None = None
    outcomes: dict[Key, Outcome] = field(default_factory=dict)
    #: The replica count the autoscaler last wrote, per autoscaled resource.
    scaled: dict[Key, int] = field(default_factory=dict)
    #: What the autoscaler adds to a resource's status: ``{"status": block, "condition": cond}``.
    autoscaling: dict[Key, dict[str, Any]] = field(default_factory=dict)
    #: Warning conditions the last reconcile found (type -> condition), e.g. a source URI with a password.
    warnings: dict[Key, dict[str, dict[str, Any]]] = field(default_factory=dict)
    _locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    #: The deployments' internal credentials (made on apply, sent on the operator's own calls).
    credentials: InternalCredentials = field(init=False)
    #: The one client of the pods (routers, replicas): closed at the operator's cleanup.
    pods: PodClient = field(init=False)
    #: The deployments' InferencePools (with the Endpoint Picker on), applied apart: their CRD may be missing.
    pools: InferencePools = field(init=False)

    def __post_init__(self) -> None:
        self.credentials = InternalCredentials(self.kube)
        # The credential of a deployment's pods: the deployment's own.
        self.pods = PodClient(credential=self.credentials.token)
        self.pools = InferencePools(self.kube)

    @property
    def build_settings(self) -> BuildSettings:
        return BuildSettings(router_image=self.config.router_image, image_pull_policy=self.config.image_pull_policy,
                             operator_namespace=self.config.operator_namespace,
                             metrics_from=self.config.metrics_from)

    def lock(self, key: Key) -> asyncio.Lock:
        """Serialises the applies of one resource (the reconcile handler and the keeper's repairs)."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def autoscaled_replicas(self, key: Key) -> int | None:
        """The replica count an apply must keep for an autoscaled resource: the autoscaler's
        last, else (after a restart) the replica Deployment's, else None (not created yet)."""
        if key in self.scaled:
            return self.scaled[key]
        for view in self.indexes.deployments_of(key) if self.indexes is not None else ():
            if view.role == ROLE_REPLICA:
                return view.replicas
        return None

    def record(self, key: Key, outcome: Outcome) -> None:
        self.outcomes[key] = outcome

    def forget(self, key: Key) -> None:
        self.outcomes.pop(key, None)
        self.scaled.pop(key, None)
        self.autoscaling.pop(key, None)
        self.credentials.forget(key)
        self.pools.forget(key)
        self.warnings.pop(key, None)
        lock = self._locks.get(key)
        if lock is not None and not lock.locked():
            del self._locks[key]

