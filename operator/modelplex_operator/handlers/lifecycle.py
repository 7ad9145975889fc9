"""Operator startup and shutdown: kopf's settings, the operator's parts and how they are wired
(:class:`Operator`), the liveness probe."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

import kopf

from modelplex_operator import MANAGED_BY
from modelplex_operator.config import OperatorConfig
from modelplex_operator.handlers import reconcile
from modelplex_operator.handlers.autoscale import AutoscaleLoop
from modelplex_operator.handlers.context import OperatorContext
from modelplex_operator.handlers.keeper import StatusKeeper
from modelplex_operator.kube import Kube

#: Prefix of kopf's own annotations on the resources (progress, last handled spec).
STATE_PREFIX = "operator.modelplex.io"
PODS = ("v1", "pods")
DEPLOYMENTS = ("apps", "v1", "deployments")
#: Server-side label selectors: the operator lists and watches only the pods and Deployments it made.
POD_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY},modelplex.io/role=replica"
DEPLOYMENT_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
MEMO_KEY = "modelplex"


@dataclass
class Operator:
    """The operator's parts, built once at startup and kept in kopf's memo: the shared context,
    the status keeper (it repairs through the reconcile's apply) and the autoscaler (its status
    changes poke the keeper). Each part receives what it needs; none reaches for another."""

    context: OperatorContext
    keeper: StatusKeeper
    autoscaler: AutoscaleLoop

    @classmethod
    def build(cls, config: OperatorConfig, kube: Kube) -> Operator:
        context = OperatorContext(config=config, kube=kube)
        keeper = StatusKeeper(context, partial(reconcile.repair, context))
        return cls(context, keeper, AutoscaleLoop(context, on_status=keeper.poke))


def operator_of(memo: Any) -> Operator:
    """The operator the startup handler put into kopf's memo."""
    operator = memo.get(MEMO_KEY) if hasattr(memo, "get") else getattr(memo, MEMO_KEY, None)
    if operator is None:
        raise RuntimeError("the operator is missing from kopf's memo (did the startup handler run?)")
    return operator


def configure_settings(settings: kopf.OperatorSettings) -> None:
    # One operator pod (the chart's Deployment uses the Recreate strategy): no peering objects,
    # hence no CRD for them and no RBAC for them.
    settings.peering.standalone = True
    # The resources are known; watching CRDs (and namespaces) would need cluster-wide RBAC.
    settings.scanning.disabled = True
    # Events: only the ones the operator posts, and warnings/errors from kopf's own logs.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "modelplex-operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STATE_PREFIX, v1=False)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=STATE_PREFIX, key="last-handled-configuration", v1=False
    )
    settings.persistence.finalizer = f"{STATE_PREFIX}/finalizer"  # never added: no deletion handlers
    # Renew watches before the usual proxies and load balancers drop them.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30
    settings.watching.label_selectors[PODS] = POD_SELECTOR
    settings.watching.label_selectors[DEPLOYMENTS] = DEPLOYMENT_SELECTOR
    # kopf's own API calls (patches of its progress, events) retry with these pauses.
    settings.networking.error_backoffs = (1, 2, 4, 8, 16)
    settings.networking.request_timeout = 60


async def startup(settings: kopf.OperatorSettings, memo: Any, logger: kopf.Logger) -> None:
    configure_settings(settings)
    config: OperatorConfig = memo.get("config") or OperatorConfig.from_env()
    memo[MEMO_KEY] = Operator.build(config, Kube.from_environment())
    where = ", ".join(config.namespaces) if config.namespaces else "all namespaces"
    logger.info("modelplex operator watching %s; router image %s", where, config.router_image)


async def cleanup(memo: Any, logger: kopf.Logger) -> None:
    operator = operator_of(memo)
    await operator.keeper.stop()
    await operator.autoscaler.stop()
    await operator.context.pods.close()
    operator.context.kube.close()
    logger.info("modelplex operator stopped")


def probe(memo: Any) -> dict[str, Any]:
    """Liveness details (kopf answers 500 when this raises)."""
    operator = operator_of(memo)
    if not operator.keeper.alive:
        raise RuntimeError("the status keeper stopped")
    if not operator.autoscaler.alive:
        raise RuntimeError("the autoscaler stopped")
    return {"resources": len(operator.context.outcomes), "status_writes": operator.keeper.writes}
