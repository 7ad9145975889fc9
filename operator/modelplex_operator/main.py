"""The switchboard: every kopf decorator of the operator, each handing off to ``handlers``.

Every handler is ``async``: kopf would run plain functions in worker threads, and the
status keeper they poke lives on the event loop.

Nothing is decided here; read this file to see *what* the operator reacts to, and the
handler modules for *how*:

==========================================  ===============================================
MultiplexedDeployment created/updated,      :func:`handlers.reconcile.reconcile`: validate,
and every one seen at operator start        apply the owned objects, post Events
any event on a MultiplexedDeployment,       the status keeper recomputes its status
its replica pods or its Deployments         (:mod:`handlers.keeper`)
every 2 s, each one with spec.autoscaling   :mod:`handlers.autoscale` reads its routers'
                                            load, scales the replicas, keeps the pods'
                                            deletion costs and the hot-models list current
an owned Deployment deleted                 the keeper applies the objects again
==========================================  ===============================================

``run_operator()`` is what ``modelplex operator`` runs.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import kopf

from modelplex.wire.names import API_GROUP, API_VERSION, LABEL_DEPLOYMENT, PLURAL
from modelplex_operator import MANAGED_BY
from modelplex_operator.config import ENV_OPERATOR_NAMESPACE, ConfigError, OperatorConfig
from modelplex_operator.handlers import lifecycle, observe, reconcile
from modelplex_operator.handlers.lifecycle import Operator, operator_of

CR = (API_GROUP, API_VERSION, PLURAL)
PODS = lifecycle.PODS
DEPLOYMENTS = lifecycle.DEPLOYMENTS
# (kopf's type of a label filter, MetaFilter, is not public: hence Any.)
OURS: dict[str, Any] = {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_DEPLOYMENT: kopf.PRESENT}
REPLICA_PODS = {**OURS, "modelplex.io/role": "replica"}


# --------------------------------------------------------------------------- lifecycle


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    await lifecycle.startup(settings, memo, logger)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    await lifecycle.cleanup(memo, logger)


@kopf.on.probe(id="operator")
async def probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    return lifecycle.probe(memo)


# --------------------------------------------------------------------------- indexes


@kopf.index(*CR)
async def mxd_by_key(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict:
    return observe.index_resource(body, _namespaced(namespace), name)


@kopf.index(*PODS, labels=REPLICA_PODS)
async def replica_pods_by_owner(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any) -> dict | None:
    return observe.index_replica_pod(body, _namespaced(namespace), labels)


@kopf.index(*DEPLOYMENTS, labels=OURS)
async def deployments_by_owner(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any) -> dict | None:
    return observe.index_deployment(body, _namespaced(namespace), labels)


def _namespaced(namespace: str | None) -> str:
    """The namespace kopf passes: every kind watched here is namespaced (kopf's handler types say
    ``None`` for cluster-wide kinds)."""
    if namespace is None:
        raise kopf.PermanentError("expected a namespaced object")
    return namespace


def _operator(memo: kopf.Memo, kwargs: dict[str, Any]) -> Operator:
    """The operator, its context holding the indexes kopf passed this handler call."""
    operator = operator_of(memo)
    operator.context.indexes = observe.Indexes(
        resources=kwargs["mxd_by_key"],
        pods=kwargs["replica_pods_by_owner"],
        deployments=kwargs["deployments_by_owner"],
    )
    return operator


# --------------------------------------------------------------------------- reconcile


@kopf.on.resume(*CR)
@kopf.on.create(*CR)
@kopf.on.update(*CR)
async def reconcile_resource(body: kopf.Body, memo: kopf.Memo, retry: int, **kwargs: Any) -> None:
    operator = _operator(memo, kwargs)
    try:
        await reconcile.reconcile(operator.context, body, retry)
    finally:  # its outcome is recorded, failed or not: the status says it
        operator.keeper.poke(reconcile.key_of(body))


# --------------------------------------------------------------------------- status


@kopf.on.event(*CR)
async def on_resource_event(namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    operator = _operator(memo, kwargs)
    operator.keeper.poke((_namespaced(namespace), name))
    operator.autoscaler.start()  # here, where kopf's Event poster is reachable (the task copies the context)


@kopf.on.event(*PODS, labels=REPLICA_PODS)
async def on_replica_pod_event(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any) -> None:
    operator = _operator(memo, kwargs)
    key = observe.owner_key(_namespaced(namespace), labels)
    if key is not None:
        operator.keeper.poke(key)


@kopf.on.event(*DEPLOYMENTS, labels=OURS)
async def on_deployment_event(type: str, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo,
                              **kwargs: Any) -> None:
    operator = _operator(memo, kwargs)
    key = observe.owner_key(_namespaced(namespace), labels)
    if key is not None:
        operator.keeper.poke(key, repair=type == "DELETED")


# --------------------------------------------------------------------------- entry point


def run_operator() -> int:
    """Run kopf with these handlers until SIGTERM/SIGINT; returns the exit code."""
    try:
        config = OperatorConfig.from_env()
    except ConfigError as error:
        print(f"modelplex operator: {error}", file=sys.stderr)
        return 2
    level = config.log_level.upper()
    logging.getLogger().setLevel(level)
    quiet = ["kubernetes.client.rest", "urllib3", "aiohttp.access"]
    if level != "DEBUG":
        # kopf says "Handler ... succeeded" for every pod event: the operator logs what matters itself.
        quiet += ["kopf.objects", "kopf.activities.probe"]
    for noisy in quiet:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    if not config.operator_namespace:
        logging.getLogger("modelplex.operator").warning(
            "the operator's namespace is unknown (set %s): replica NetworkPolicies admit the operator "
            "from each deployment's own namespace only", ENV_OPERATOR_NAMESPACE)
    memo = kopf.Memo(config=config)
    kopf.run(
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        standalone=True,
        liveness_endpoint=config.health_endpoint or None,
        memo=memo,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(run_operator())
