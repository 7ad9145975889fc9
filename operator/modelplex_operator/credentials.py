"""The internal credential of every namespace the operator serves (README, "Security").

One Secret, ``modelplex-internal``, per namespace, holding a random token: made by the first
MultiplexedDeployment's reconcile, owned by each of them (so garbage collection removes it with
the last one), mounted by their routers and replicas. The operator reads it back for its own
calls to replicas (``GET /v1/models``) and routers (``GET /v1/load``). A Secret of that name that
the operator did not make (no managed-by label) is left alone and reported, never adopted.

Rotation: write a new ``token`` into the Secret; pods read the mounted file again when the
kubelet updates it (within about a minute), and the operator at its next apply of a resource of
that namespace (a reconcile, or the periodic resync).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

from modelplex.wire.credentials import INTERNAL_SECRET_KEY, INTERNAL_SECRET_NAME, new_token
from modelplex_operator import builders
from modelplex_operator.kube import Kube, KubeError, foreign, made_by_modelplex

log = logging.getLogger("modelplex.operator.credentials")


def token_of(secret: dict[str, Any]) -> str | None:
    """The token a ``modelplex-internal`` Secret holds, or None."""
    encoded = (secret.get("data") or {}).get(INTERNAL_SECRET_KEY)
    try:
        return base64.b64decode(encoded).decode() if encoded else None
    except ValueError:
        return None


def owned_by(secret: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether ``owner`` is among the Secret's owners."""
    return any(ref.get("uid") == owner["uid"] for ref in (secret.get("metadata") or {}).get("ownerReferences") or ())


class InternalCredentials:
    """The per-namespace internal credentials: ensured on reconcile, read for the operator's calls."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self._tokens: dict[str, str] = {}
        #: The namespace's Secret as last read or written: a new owner is added to it without
        #: reading it again (its resourceVersion guards the write; 409 when it changed since).
        self._secrets: dict[str, dict[str, Any]] = {}
        #: One ensure at a time per namespace: the deployments of a namespace all add themselves
        #: to its one Secret, and concurrent writes would conflict (409) and be retried by kopf.
        self._locks: dict[str, asyncio.Lock] = {}

    async def ensure(self, namespace: str, owner: dict[str, Any]) -> None:
        """The namespace's Secret exists and ``owner`` is among its owners."""
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            await asyncio.to_thread(self._ensure, namespace, owner)

    def _ensure(self, namespace: str, owner: dict[str, Any]) -> None:
        known = self._secrets.get(namespace)
        if known is not None and not owned_by(known, owner):
            try:
                self._add_owner(namespace, known, owner)
                return
            except KubeError as error:
                if error.status not in (404, 409):  # changed or deleted since: read it again
                    raise
        existing = self.kube.get("v1", "Secret", namespace, INTERNAL_SECRET_NAME)
        if existing is None:
            try:
                created = self.kube.create(builders.internal_secret(namespace, new_token(), [owner]))
            except KubeError as error:
                if error.status != 409:  # 409: another reconcile made it first; read theirs
                    raise
                existing = self.kube.get("v1", "Secret", namespace, INTERNAL_SECRET_NAME)
            else:
                log.info("%s: created Secret %s (the namespace's internal credential)", namespace, INTERNAL_SECRET_NAME)
                self.remember(namespace, created)
                return
        if existing is None:
            raise KubeError(404, "NotFound", f"Secret {INTERNAL_SECRET_NAME} vanished while being made")
        if not made_by_modelplex(existing):
            self._secrets.pop(namespace, None)
            raise foreign(f"Secret {INTERNAL_SECRET_NAME}")
        if not owned_by(existing, owner):
            self._add_owner(namespace, existing, owner)
        else:
            self.remember(namespace, existing)

    def _add_owner(self, namespace: str, secret: dict[str, Any], owner: dict[str, Any]) -> None:
        """Add ``owner`` to the Secret (as read at ``secret``'s resourceVersion: 409 when it changed)."""
        owners = (secret.get("metadata") or {}).get("ownerReferences") or []
        added = {**owner, "controller": False, "blockOwnerDeletion": False}
        patched = self.kube.merge_patch("v1", "Secret", namespace, INTERNAL_SECRET_NAME,
                                        {"metadata": {"ownerReferences": [*owners, added],
                                                      "resourceVersion": secret["metadata"]["resourceVersion"]}})
        self.remember(namespace, patched)

    def remember(self, namespace: str, secret: dict[str, Any]) -> None:
        """Keep the namespace's Secret and its token as read (by :meth:`ensure`, or by a test)."""
        if made_by_modelplex(secret) and (secret.get("metadata") or {}).get("resourceVersion"):
            self._secrets[namespace] = secret
        token = token_of(secret)
        if token is not None:
            self._tokens[namespace] = token

    def token(self, namespace: str) -> str | None:
        """The namespace's token as last read (None before its first reconcile)."""
        return self._tokens.get(namespace)
