"""The operator's settings, read once from its environment (the chart sets them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

ENV_WATCH_NAMESPACES = "MODELPLEX_WATCH_NAMESPACES"
ENV_ROUTER_IMAGE = "MODELPLEX_ROUTER_IMAGE"
ENV_LOG_LEVEL = "MODELPLEX_LOG_LEVEL"
ENV_HEALTH = "MODELPLEX_OPERATOR_HEALTH"
ENV_RESYNC = "MODELPLEX_OPERATOR_RESYNC_SECONDS"
ENV_IMAGE_PULL_POLICY = "MODELPLEX_IMAGE_PULL_POLICY"
#: The operator's own namespace (the chart sets it): replicas accept its reads of /v1/models.
ENV_OPERATOR_NAMESPACE = "MODELPLEX_OPERATOR_NAMESPACE"
#: Where a pod's ServiceAccount token names its namespace: the operator's own, when the variable is unset.
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: NetworkPolicy peers (a JSON list) that may scrape the replicas' /metrics (the chart's monitoring values).
ENV_METRICS_FROM = "MODELPLEX_METRICS_FROM"

DEFAULT_ROUTER_IMAGE = "modelplex/router:0.1.0"
DEFAULT_HEALTH = "http://0.0.0.0:8080/healthz"
DEFAULT_RESYNC_S = 300.0
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """An operator setting that cannot be used; the message names the variable and the value."""


@dataclass(frozen=True)
class OperatorConfig:
    #: Namespaces to watch; empty means the whole cluster.
    namespaces: tuple[str, ...] = ()
    router_image: str = DEFAULT_ROUTER_IMAGE
    log_level: str = "info"
    #: kopf's liveness endpoint (``http://host:port/path``); empty turns it off.
    health_endpoint: str = DEFAULT_HEALTH
    #: Every this many seconds each resource's objects are applied again (drift repair).
    resync_seconds: float = DEFAULT_RESYNC_S
    #: imagePullPolicy of the pods; empty leaves Kubernetes' default.
    image_pull_policy: str = ""
    #: Where the operator runs: MODELPLEX_OPERATOR_NAMESPACE, else its pod's ServiceAccount
    #: namespace; empty: unknown (replica policies then admit it from their own namespace only).
    operator_namespace: str = ""
    #: NetworkPolicy peers allowed to scrape the replicas' metrics.
    metrics_from: tuple[dict[str, Any], ...] = ()

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 service_account_namespace: str = SERVICE_ACCOUNT_NAMESPACE_FILE) -> OperatorConfig:
        env = os.environ if env is None else env
        namespaces = tuple(dict.fromkeys(ns.strip() for ns in env.get(ENV_WATCH_NAMESPACES, "").split(",") if ns.strip()))
        level = (env.get(ENV_LOG_LEVEL) or env.get("LOG_LEVEL") or "info").strip().lower()
        if level not in LOG_LEVELS:
            raise ConfigError(f"{ENV_LOG_LEVEL}: must be one of {', '.join(LOG_LEVELS)} (got {level!r})")
        raw_resync = env.get(ENV_RESYNC, "").strip()
        try:
            resync = float(raw_resync) if raw_resync else DEFAULT_RESYNC_S
        except ValueError:
            raise ConfigError(f"{ENV_RESYNC}: must be a number of seconds (got {raw_resync!r})") from None
        if resync < 1:
            raise ConfigError(f"{ENV_RESYNC}: must be at least 1 (got {raw_resync!r})")
        policy = env.get(ENV_IMAGE_PULL_POLICY, "").strip()
        if policy and policy not in ("Always", "IfNotPresent", "Never"):
            raise ConfigError(f"{ENV_IMAGE_PULL_POLICY}: must be Always, IfNotPresent or Never (got {policy!r})")
        return cls(
            namespaces=namespaces,
            router_image=env.get(ENV_ROUTER_IMAGE, "").strip() or DEFAULT_ROUTER_IMAGE,
            log_level=level,
            health_endpoint=env.get(ENV_HEALTH, DEFAULT_HEALTH).strip(),
            resync_seconds=resync,
            image_pull_policy=policy,
            operator_namespace=env.get(ENV_OPERATOR_NAMESPACE, "").strip() or _read(service_account_namespace),
            metrics_from=_peers(env.get(ENV_METRICS_FROM, "")),
        )


def _peers(raw: str) -> tuple[dict[str, Any], ...]:
    """NetworkPolicy peers from JSON (``[{"namespaceSelector": {...}, "podSelector": {...}}]``)."""
    if not raw.strip():
        return ()
    try:
        peers = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{ENV_METRICS_FROM}: must be a JSON list of NetworkPolicy peers (got {raw!r})") from None
    if not isinstance(peers, list) or not all(isinstance(peer, dict) for peer in peers):
        raise ConfigError(f"{ENV_METRICS_FROM}: must be a JSON list of NetworkPolicy peers (got {raw!r})")
    return tuple(peers)


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return ""
