"""``@serve.deployment``, ``.options()`` and ``.bind()``: a graph of deployments, as in Ray Serve.

Nothing runs here: :func:`deployment` wraps a class (or function) with its options, and
``.bind(*args, **kwargs)`` records its constructor arguments as an :class:`Application`. A bound
application among the arguments is an edge of the graph: the constructor receives a
:class:`~modelplex.handles.DeploymentHandle` to it. :mod:`modelplex.serve.graph` turns an
application into MultiplexedDeployments; :func:`modelplex.serve.run` runs them here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from modelplex.serve.config import AutoscalingConfig, LoggingConfig

#: Ray's default for ``max_ongoing_requests``.
DEFAULT_MAX_ONGOING_REQUESTS = 5
#: Ray Serve's ``autoscaling_config`` keys and their ``spec.autoscaling`` names.
AUTOSCALING_FIELDS = {
    "min_replicas": "minReplicas", "max_replicas": "maxReplicas", "initial_replicas": "initialReplicas",
    "target_ongoing_requests": "targetOngoingRequests", "target_num_ongoing_requests_per_replica":
    "targetOngoingRequests", "upscale_delay_s": "upscaleDelaySeconds", "downscale_delay_s": "downscaleDelaySeconds",
    "look_back_period_s": "lookBackPeriodSeconds",
}
#: Ray's tuning of its own control loop: accepted, without effect (Modelplex decides every second).
AUTOSCALING_IGNORED = {"metrics_interval_s", "smoothing_factor", "upscale_smoothing_factor",
                       "downscale_smoothing_factor", "upscaling_factor", "downscaling_factor",
                       "downscale_to_zero_delay_s", "aggregation_function"}
#: ``num_replicas="auto"``: Ray's defaults then allow up to 100 replicas.
AUTO_MAX_REPLICAS = 100

@dataclass(frozen=True)
class DeploymentOptions:
    """Ray Serve's deployment options that Modelplex honours (the rest are refused by name)."""

    name: str
    num_replicas: int | str | None = None
    max_ongoing_requests: int | None = None
    ray_actor_options: dict[str, Any] = field(default_factory=dict)
    autoscaling_config: dict[str, Any] | None = None
    user_config: Any = None
    #: ``spec.gracefulShutdownTimeoutSeconds`` (the drain; a pod's termination grace follows).
    graceful_shutdown_timeout_s: float | None = None
    #: Ray's period of checking a draining replica for requests: the drain here ends when the
    #: last request does, so there is no loop to tune (accepted, documented).
    graceful_shutdown_wait_loop_s: float | None = None
    #: ``spec.healthCheck``: how often the deployment's ``check_health`` runs, and its bound.
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    #: ``spec.router.maxQueuedRequests``: None is Ray's -1 (no bound of its own).
    max_queued_requests: int | None = None
    #: ``spec.logging`` and ``spec.router.accessLog``; None: the defaults.
    logging_config: LoggingConfig | None = None

    def spec(self) -> dict[str, Any]:
        """The manifest's fields of ``max_queued_requests`` and ``logging_config`` (router fields
        under ``router``)."""
        spec: dict[str, Any] = {} if self.logging_config is None else self.logging_config.spec()
        if self.max_queued_requests is not None:
            spec["router"] = {**spec.get("router", {}), "maxQueuedRequests": self.max_queued_requests}
        return spec

    def health_check(self) -> dict[str, float]:
        """``spec.healthCheck`` from the health check options (empty: the defaults, Ray's)."""
        return {key: value for key, value in (("periodSeconds", self.health_check_period_s),
                                              ("timeoutSeconds", self.health_check_timeout_s)) if value is not None}

    def replicas(self) -> int:
        """Replicas to start: ``num_replicas``, else the autoscaling config's initial or minimum."""
        if isinstance(self.num_replicas, int):
            return self.num_replicas
        config = self.autoscaling_config or {}
        return int(config.get("initial_replicas") or config.get("min_replicas") or 1)

    def replica_spec(self) -> dict[str, Any]:
        """``{"replicas": N}``, or ``{"autoscaling": {...}}`` from ``autoscaling_config`` (Ray's keys
        as ``spec.autoscaling``'s; ``num_replicas="auto"`` allows up to 100 replicas, as Ray does)."""
        if self.autoscaling_config is None:
            return {"replicas": self.replicas()}
        scaling = {AUTOSCALING_FIELDS[key]: value for key, value in self.autoscaling_config.items()
                   if key in AUTOSCALING_FIELDS}
        if self.num_replicas == "auto":
            scaling.setdefault("maxReplicas", max(AUTO_MAX_REPLICAS, scaling.get("minReplicas", 1)))
        return {"autoscaling": scaling}

    def resources(self) -> dict[str, Any]:
        """``ray_actor_options`` as container resources: ``num_cpus`` a CPU request,
        ``num_gpus`` an ``nvidia.com/gpu`` limit (a fraction asks for a whole GPU: Kubernetes
        does not share one), ``memory`` (bytes) a memory request."""
        actor = self.ray_actor_options
        requests: dict[str, Any] = {}
        limits: dict[str, Any] = {}
        if actor.get("num_cpus"):
            requests["cpu"] = str(actor["num_cpus"])
        if actor.get("memory"):
            requests["memory"] = str(int(actor["memory"]))
        if actor.get("num_gpus"):
            limits["nvidia.com/gpu"] = max(1, round(actor["num_gpus"]))
        for name, amount in (actor.get("resources") or {}).items():
            limits[name] = math.ceil(amount)  # Kubernetes counts extended resources in whole units
        return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}

    def env(self) -> dict[str, str]:
        """``ray_actor_options.runtime_env.env_vars``: the replicas' environment (a pod's ``env``)."""
        runtime_env = self.ray_actor_options.get("runtime_env") or {}
        return {str(name): str(value) for name, value in (runtime_env.get("env_vars") or {}).items()}


_OPTIONS = {"name", "num_replicas", "max_ongoing_requests", "ray_actor_options", "autoscaling_config", "user_config",
            "graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s", "health_check_period_s",
            "health_check_timeout_s", "max_queued_requests", "logging_config"}
_ACTOR_OPTIONS = {"num_cpus", "num_gpus", "memory", "runtime_env", "resources"}
#: Of Ray's runtime_env, what a replica's process can be given; the rest is the image's work.
_RUNTIME_ENV = {"env_vars"}
#: A Kubernetes extended resource: ``domain/name``.
_EXTENDED_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _check_actor_options(actor: dict[str, Any]) -> None:
    runtime_env = actor.get("runtime_env") or {}
    if not isinstance(runtime_env, dict):
        raise TypeError(f"serve.deployment: runtime_env must be a dict (got {type(runtime_env).__name__})")
    unknown = sorted(set(runtime_env) - _RUNTIME_ENV)
    if unknown:
        raise TypeError(f"serve.deployment: runtime_env {', '.join(unknown)} not supported: a replica runs in its "
                        "image, so install packages and code there (its Dockerfile); runtime_env takes env_vars")
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(isinstance(name, str) and isinstance(value, str)
                                                 for name, value in env_vars.items()):
        raise TypeError("serve.deployment: runtime_env env_vars must be a dict of strings")
    resources = actor.get("resources") or {}
    if not isinstance(resources, dict):
        raise TypeError(f"serve.deployment: ray_actor_options resources must be a dict (got {type(resources).__name__})")
    for name, amount in resources.items():
        if not isinstance(name, str) or not _EXTENDED_RESOURCE.match(name):
            raise ValueError(f"serve.deployment: resource {name!r}: a pod's limits name extended resources as "
                             "domain/name (example.com/fpga)")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
            raise ValueError(f"serve.deployment: resource {name!r} must be a number > 0 (got {amount!r})")


def _check_seconds(options: dict[str, Any]) -> None:
    for key in ("graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s", "health_check_period_s",
                "health_check_timeout_s"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                                  or (key.startswith("health") and value == 0)):
            raise ValueError(f"serve.deployment: {key} must be a number of seconds "
                             f"{'> 0' if key.startswith('health') else '>= 0'} (got {value!r})")


def _checked(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"serve.deployment: unsupported option(s) {', '.join(unknown)}; "
                        f"Modelplex takes {', '.join(sorted(_OPTIONS))}")
    actor = options.get("ray_actor_options") or {}
    unknown = sorted(set(actor) - _ACTOR_OPTIONS)
    if unknown:
        raise TypeError(f"serve.deployment: unsupported ray_actor_options {', '.join(unknown)}; "
                        f"Modelplex takes {', '.join(sorted(_ACTOR_OPTIONS))}")
    _check_actor_options(actor)
    _check_seconds(options)
    replicas = options.get("num_replicas")
    if replicas is not None and replicas != "auto" and (isinstance(replicas, bool) or not isinstance(replicas, int)
                                                        or replicas < 0):
        raise ValueError(f"serve.deployment: num_replicas must be an integer >= 0 or 'auto' (got {replicas!r})")
    queued = options.get("max_queued_requests")
    if queued is not None and (isinstance(queued, bool) or not isinstance(queued, int) or (queued < 1 and queued != -1)):
        raise ValueError(f"serve.deployment: max_queued_requests must be -1 (no limit) or a positive integer "
                         f"(got {queued!r})")
    if queued == -1:
        options = {**options, "max_queued_requests": None}  # Ray's default: no bound
    if options.get("logging_config") is not None:
        options = {**options, "logging_config": LoggingConfig.of(options["logging_config"])}
    ongoing = options.get("max_ongoing_requests")
    if ongoing is not None and (isinstance(ongoing, bool) or not isinstance(ongoing, int) or ongoing < 1):
        raise ValueError(f"serve.deployment: max_ongoing_requests must be an integer >= 1 (got {ongoing!r})")
    scaling = options.get("autoscaling_config")
    if isinstance(scaling, AutoscalingConfig):  # Ray's config object: its fields by Ray's keys
        scaling = scaling.to_dict()
        options = {**options, "autoscaling_config": scaling}
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise TypeError(f"serve.deployment: autoscaling_config must be a dict (got {type(scaling).__name__})")
        if isinstance(replicas, int):
            raise ValueError("serve.deployment: num_replicas and autoscaling_config both set: give one "
                             "(num_replicas='auto' autoscales)")
        unknown = sorted(set(scaling) - set(AUTOSCALING_FIELDS) - AUTOSCALING_IGNORED)
        if unknown:
            raise TypeError(f"serve.deployment: unsupported autoscaling_config key(s) {', '.join(unknown)}; "
                            f"Modelplex takes {', '.join(sorted(AUTOSCALING_FIELDS))}")
    if replicas == "auto":
        options = {**options, "autoscaling_config": scaling or {}}
    elif isinstance(replicas, int) and "autoscaling_config" not in options:
        options = {**options, "autoscaling_config": None}  # .options(num_replicas=N) stops autoscaling
    return {**options, "ray_actor_options": dict(actor)}


class Deployment:
    """A class or function made a deployment by :func:`deployment`; ``.bind()`` it to deploy it."""

    def __init__(self, target: Callable, options: DeploymentOptions):
        self.func_or_class = target
        self._options = options

    @property
    def name(self) -> str:
        return self._options.name

    @property
    def deployment_options(self) -> DeploymentOptions:
        return self._options

    def options(self, **options: Any) -> Deployment:
        """A copy with these options changed (the same names as :func:`deployment`)."""
        return Deployment(self.func_or_class, replace(self._options, **_checked(options)))

    def bind(self, *args: Any, **kwargs: Any) -> Application:
        """This deployment with its constructor arguments: an application to run or build."""
        return Application(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"deployment {self.name!r} cannot be called or constructed directly: "
                        f"use {self.name}.bind(...) and serve.run(...)")

    def __repr__(self) -> str:
        return f"Deployment(name={self.name!r})"


@dataclass(eq=False)
class Application:
    """A bound deployment: the node of a graph whose edges are the applications among ``args``."""

    deployment: Deployment
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def deployment(_target: Callable | None = None, **options: Any) -> Deployment | Callable[[Callable], Deployment]:
    """Make a class (or function) a deployment, bare (``@serve.deployment``) or with options
    (``@serve.deployment(num_replicas=2, max_ongoing_requests=8, ray_actor_options={"num_gpus": 1})``)."""

    checked = _checked(options)

    def wrap(target: Callable) -> Deployment:
        if not callable(target):
            raise TypeError(f"@serve.deployment takes a class or a function (got {target!r})")
        return Deployment(target, DeploymentOptions(**{"name": target.__name__, **checked}))

    return wrap(_target) if _target is not None else wrap
