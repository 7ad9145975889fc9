"""Every deployment's internal credential (README, "Security").

One Secret per MultiplexedDeployment, ``N-internal``, holding a random token: made by its first
reconcile, controlled by it (it goes with the deployment), mounted by its routers and replicas,
and by the routers of the deployments that list it as a caller (``spec.router.callers``). The
operator reads it back for its own calls to the deployment's replicas (``GET /v1/models``) and
routers (``GET /v1/load``). A Secret of that name that the operator did not make for this
deployment is left alone and reported, never adopted.

Upgrading from the namespace-wide ``modelplex-internal`` of earlier versions: a deployment whose
pods exist already gets the namespace's token in its Secret too (``namespace-token``), so its
rolling pods and the ones not rolled yet accept each other; once every pod of the deployment
runs the new template (:meth:`InternalCredentials.settle`), that key goes and the pods refuse
the namespace's token (after a grace: :data:`~modelplex.wire.credentials.LEGACY_GRACE_S`). The
``CredentialUpgrade`` condition says where it stands.

Rotation: write a new ``token`` into ``N-internal``; pods read the mounted file again when the
kubelet updates it (within about a minute), and the operator at its next apply (a reconcile, or
the periodic resync).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass
from typing import Any, Iterable

from modelplex.wire.credentials import (INTERNAL_SECRET_KEY, INTERNAL_SECRET_NAME, LEGACY_SECRET_KEY,
                                        internal_secret_name, new_token)
from modelplex.wire.names import ROLE_REPLICA, ROLE_ROUTER
from modelplex.wire.spec import Deployment
from modelplex_operator import builders
from modelplex_operator.kube import Kube, KubeError, check_ownership, made_by_modelplex
from modelplex_operator.status import DeploymentView, Key

log = logging.getLogger("modelplex.operator.credentials")

#: The condition of a deployment upgraded from a namespace credential.
CREDENTIAL_UPGRADE = "CredentialUpgrade"
#: On ``N-internal``: ``accepting`` while the namespace's token is in it, ``done`` after.
ANNOTATION_UPGRADE = builders.ANNOTATION_CREDENTIAL_UPGRADE


def value_of(secret: dict[str, Any], key: str) -> str | None:
    """A Secret's value at ``key``, decoded, or None."""
    encoded = (secret.get("data") or {}).get(key)
    try:
        return base64.b64decode(encoded).decode() if encoded else None
    except ValueError:
        return None


def upgrade_state(secret: dict[str, Any] | None) -> str:
    """``accepting``, ``done`` or "" (never upgraded) for a deployment's Secret."""
    annotations = ((secret or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_UPGRADE, "")


@dataclass(frozen=True)
class Known:
    """A deployment's Secret as last read: its token, and the namespace's while it upgrades."""

    token: str | None
    legacy: str | None
    upgrade: str


def rolled(views: Iterable[DeploymentView], applied: dict[str, int]) -> bool:
    """Whether every pod of the deployment runs the template the operator applied last (the one
    that mounts ``N-internal``): both Deployments at or past the generations it wrote, rolled out."""
    by_role = {view.role: view for view in views}
    for role in (ROLE_REPLICA, ROLE_ROUTER):
        view = by_role.get(role)
        if role not in applied or view is None or view.generation < applied[role] or not view.rolled_out:
            return False
    return True


def upgrade_condition(state: str, deployment: str, generation: int) -> dict[str, Any] | None:
    """The ``CredentialUpgrade`` condition (None for a deployment that never had to upgrade)."""
    secret = internal_secret_name(deployment)
    if state == "accepting":
        status, reason = "True", "AcceptingNamespaceCredential"
        message = (f"the pods accept the namespace's {INTERNAL_SECRET_NAME} credential beside their own ({secret}) "
                   "until every pod of the deployment has rolled")
    elif state == "done":
        status, reason = "False", "Completed"
        message = f"every pod has rolled: the pods accept only the deployment's own credential ({secret})"
    else:
        return None
    return {"type": CREDENTIAL_UPGRADE, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation}


class InternalCredentials:
    """The deployments' internal credentials: ensured on apply, read for the operator's calls,
    the upgrade from a namespace credential ended once the pods have rolled."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self._known: dict[Key, Known] = {}
        #: The generations of the Deployments the last apply wrote, per resource (by role).
        self._applied: dict[Key, dict[str, int]] = {}

    async def ensure(self, deployment: Deployment, owner: dict[str, Any]) -> None:
        """``N-internal`` exists, made for this deployment (``owner``), and is known."""
        await asyncio.to_thread(self._ensure, deployment, owner)

    def _ensure(self, deployment: Deployment, owner: dict[str, Any]) -> None:
        ns, name = deployment.namespace, internal_secret_name(deployment.name)
        existing = self.kube.get("v1", "Secret", ns, name)
        if existing is None:
            legacy = self._namespace_token(deployment)
            try:
                existing = self.kube.create(builders.internal_secret(deployment, owner, new_token(), legacy))
            except KubeError as error:
                if error.status != 409:  # 409: another apply made it first; read theirs
                    raise
                existing = self.kube.get("v1", "Secret", ns, name)
            else:
                log.info("%s: created Secret %s (the deployment's internal credential%s)", ns, name,
                         ", with the namespace's beside it until its pods have rolled" if legacy else "")
        if existing is None:
            raise KubeError(404, "NotFound", f"Secret {name} vanished while being made")
        check_ownership(existing, builders.internal_secret(deployment, owner, ""), owner["uid"], f"Secret {name}")
        self.remember((ns, deployment.name), existing)

    def _namespace_token(self, deployment: Deployment) -> str | None:
        """The namespace's token, where the deployment has pods already that hold it (an upgrade)."""
        ns = deployment.namespace
        if self.kube.get("apps/v1", "Deployment", ns, builders.replica_name(deployment.name)) is None:
            return None  # a new deployment: its pods will know only their own
        secret = self.kube.get("v1", "Secret", ns, INTERNAL_SECRET_NAME)
        return value_of(secret, INTERNAL_SECRET_KEY) if secret is not None and made_by_modelplex(secret) else None

    def remember(self, key: Key, secret: dict[str, Any]) -> None:
        """Keep a deployment's Secret as read (by :meth:`ensure`, or by a test)."""
        self._known[key] = Known(value_of(secret, INTERNAL_SECRET_KEY), value_of(secret, LEGACY_SECRET_KEY),
                                 upgrade_state(secret))

    def applied(self, key: Key, generations: dict[str, int]) -> None:
        """The generations of the Deployments an apply wrote (role -> generation)."""
        self._applied[key] = dict(generations)

    def token(self, key: Key) -> str | None:
        """What the operator sends to the pods of ``key``: the namespace's token while they
        upgrade from it (the pods not rolled yet know only it), else the deployment's own; None
        before its first apply."""
        known = self._known.get(key)
        return None if known is None else known.legacy or known.token

    def state(self, key: Key) -> str:
        known = self._known.get(key)
        return known.upgrade if known is not None else ""

    def settle(self, key: Key, views: Iterable[DeploymentView]) -> bool:
        """End the upgrade of ``key`` once every pod has rolled: the namespace's token leaves its
        Secret. True when it ended now."""
        known = self._known.get(key)
        if known is None or known.legacy is None or not rolled(views, self._applied.get(key, {})):
            return False
        ns, name = key[0], internal_secret_name(key[1])
        self.kube.merge_patch("v1", "Secret", ns, name, {
            "metadata": {"annotations": {ANNOTATION_UPGRADE: "done"}}, "data": {LEGACY_SECRET_KEY: None}})
        self._known[key] = Known(known.token, None, "done")
        log.info("%s/%s: every pod has rolled; the namespace's credential is refused from now on", *key)
        return True

    def forget(self, key: Key) -> None:
        self._known.pop(key, None)
        self._applied.pop(key, None)
