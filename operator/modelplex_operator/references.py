"""What the operator checks before it applies, beyond the spec's own rules: what a deployment's
Secrets and URIs hold that would break the trust boundary.

- A client named ``internal`` in the auth Secret (``spec.router.auth.secretRef``): the router's
  name for its own components. The spec is invalid until the key is renamed (a ``Degraded``
  condition and a Warning Event name the key, never its token).
- A user and password in ``spec.modelSource.uri`` (``https://user:pass@host/...``): refused for
  a new deployment (credentials go through ``modelSource.secretRef``); on one the operator served
  already, a ``SourceCredentials`` warning condition and Event, and it goes on serving. The spec
  ConfigMap never holds them either way (:func:`modelplex_operator.builders.spec_document`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from modelplex.wire.credentials import RESERVED_CLIENT
from modelplex.wire.redact import redact_url
from modelplex.wire.spec import Deployment, SpecError
from modelplex_operator import builders
from modelplex_operator.kube import Kube

SOURCE_CREDENTIALS = "SourceCredentials"


def serving(kube: Kube, deployment: Deployment) -> bool:
    """Whether the operator made this deployment's pods already (its replica Deployment exists)."""
    return kube.get("apps/v1", "Deployment", deployment.namespace, builders.replica_name(deployment.name)) is not None


def source_warning(deployment: Deployment, body: Mapping[str, Any], existing: bool) -> dict[str, Any] | None:
    """The ``SourceCredentials`` warning condition for a URI with userinfo on an ``existing``
    deployment; raises :class:`SpecError` for a new one; None when the URI has none."""
    source = deployment.spec.model_source
    if source is None or not source.has_userinfo:
        return None
    shown = redact_url(source.uri)
    if not existing:
        raise SpecError([f"spec.modelSource.uri: a user or password in the URI is refused (got {shown!r}): give "
                         "credentials through spec.modelSource.secretRef"])
    return {"type": SOURCE_CREDENTIALS, "status": "True", "reason": "UserinfoInURI",
            "message": f"spec.modelSource.uri holds a user or password ({shown!r}): move them to "
                       "spec.modelSource.secretRef; a new deployment with such a URI is refused",
            "observedGeneration": int((body.get("metadata") or {}).get("generation") or 1)}


def client_names(kube: Kube, deployment: Deployment) -> list[str]:
    """The client names of the deployment's auth Secret ([] without auth, or while it is missing)."""
    auth = deployment.spec.router.auth
    if auth is None:
        return []
    secret = kube.get("v1", "Secret", deployment.namespace, auth.secret_ref.name) or {}
    return sorted({**(secret.get("data") or {}), **(secret.get("stringData") or {})})


async def check_references(kube: Kube, deployment: Deployment, body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The warning conditions (by type) of ``deployment``; raises :class:`SpecError` for what
    makes it invalid."""
    auth = deployment.spec.router.auth
    if auth is not None and RESERVED_CLIENT in await asyncio.to_thread(client_names, kube, deployment):
        raise SpecError([f"spec.router.auth.secretRef: Secret {auth.secret_ref.name!r} has a client named "
                         f"{RESERVED_CLIENT!r}, the router's name for its own components: rename that key"])
    source = deployment.spec.model_source
    existing = source is not None and source.has_userinfo and await asyncio.to_thread(serving, kube, deployment)
    warning = source_warning(deployment, body, existing)
    return {warning["type"]: warning} if warning is not None else {}
