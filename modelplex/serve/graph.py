"""An application graph as MultiplexedDeployments: pure, shared by ``serve.run`` and ``modelplex build``.

Every bound deployment becomes one node named by its DNS label (``SimpleModel`` →
``simple-model``); the same bound object used twice is one node, two different bindings of one
deployment are ``name`` and ``name-1``, as Ray suffixes them. Bound arguments become
:class:`HandleRef` s, which the replica turns into handles (:mod:`modelplex.serve.hosted`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelplex.serve.deployment import Application, DeploymentOptions
from modelplex.wire.names import API_GROUP, API_VERSION, KIND, dns_label

#: The annotation that lists a deployment's edges: the deployments its handles call.
ANNOTATION_HANDLES = f"{API_GROUP}/handles"
#: The label that names the application a built deployment belongs to (``modelplex build --name``).
LABEL_APP = f"{API_GROUP}/app"
#: In a replica's environment: its deployment's Ray name and its application's, for
#: ``serve.get_replica_context()`` (:mod:`modelplex.serve.hosted`).
ENV_DEPLOYMENT = "MODELPLEX_SERVE_DEPLOYMENT"
ENV_APPLICATION = "MODELPLEX_SERVE_APPLICATION"
DEFAULT_APPLICATION = "default"


def scoped(app_name: str | None, deployment: str) -> str:
    """The object name of ``deployment`` in the application ``app_name``: ``video-a-decode-video``,
    so two applications built into one namespace may both have a ``decode-video`` (Ray scopes
    deployment names per application). No application name: the deployment's own."""
    return deployment if not app_name else dns_label(f"{app_name}-{deployment}")


@dataclass(frozen=True)
class HandleRef:
    """A constructor argument that is another deployment of the graph."""

    deployment: str


@dataclass
class Node:
    """One deployment of the graph, its constructor arguments with edges as :class:`HandleRef` s."""

    name: str
    target: Any
    options: DeploymentOptions
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def edges(self) -> list[str]:
        return sorted({ref.deployment for ref in _refs((self.args, self.kwargs))})


def _refs(value: Any):
    if isinstance(value, HandleRef):
        yield value
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from _refs(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _refs(item)


def walk(app: Application) -> list[Node]:
    """The nodes of ``app``'s graph, the ingress first, each dependency before its users after it."""
    if not isinstance(app, Application):
        raise TypeError(f"expected an application, Deployment.bind(...) (got {type(app).__name__})")
    nodes: list[Node] = []
    names: dict[int, str] = {}
    taken: set[str] = set()
    visiting: set[int] = set()

    def visit(bound: Application) -> str:
        if id(bound) in names:
            return names[id(bound)]
        if id(bound) in visiting:
            raise ValueError(f"the application graph has a cycle through {bound.deployment.name!r}")
        visiting.add(id(bound))
        base = dns_label(bound.deployment.name)
        name, suffix = base, 0
        while name in taken:
            suffix += 1
            name = f"{base}-{suffix}"
        taken.add(name)
        node = Node(name, bound.deployment.func_or_class, bound.deployment.deployment_options, (), {})
        nodes.append(node)
        node.args = tuple(convert(arg) for arg in bound.args)
        node.kwargs = {key: convert(value) for key, value in bound.kwargs.items()}
        names[id(bound)] = name
        visiting.discard(id(bound))
        return name

    def convert(value: Any) -> Any:
        if isinstance(value, Application):
            return HandleRef(visit(value))
        if isinstance(value, (list, tuple)):
            return type(value)(convert(item) for item in value)
        if isinstance(value, dict):
            return {key: convert(item) for key, item in value.items()}
        return value

    visit(app)
    return nodes


def decorated(target: Any) -> dict[str, Any]:
    """The spec's ``multiplexing`` and ``batching`` as the class's ``@multiplexed`` and ``@batch``
    declare them (a value only where every decorated method agrees: the spec's applies to all)."""
    members = [member for _, member in inspect.getmembers(target)] if inspect.isclass(target) else [target]
    caches = {declared[1] for member in members if (declared := getattr(member, "__modelplex_multiplexed__", None))}
    batches = {(member._get_max_batch_size(), member._get_batch_wait_timeout_s())
               for member in members if callable(getattr(member, "_get_max_batch_size", None))}
    spec: dict[str, Any] = {}
    if len(caches) == 1:
        spec["multiplexing"] = {"maxModelsPerReplica": caches.pop()}
    if len(batches) == 1:
        size, wait_s = batches.pop()
        spec["batching"] = {"maxBatchSize": size, "batchWaitTimeoutMs": round(wait_s * 1000, 3)}
    return spec


#: Ray Serve's environment variables that have a Modelplex equivalent: the spec field each sets.
RAY_ENVIRONMENT = {"RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S": ("multiplexing", "matchingTimeoutSeconds")}


def ray_environment(environ: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """The spec fields that Ray Serve's environment variables in ``environ`` set (a value that
    is not a number of seconds >= 0 is refused, by name)."""
    spec: dict[str, dict[str, float]] = {}
    for name, (section, field) in RAY_ENVIRONMENT.items():
        raw = environ.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 <= value < math.inf:
            raise ValueError(f"{name}={raw!r}: must be a number of seconds >= 0")
        spec.setdefault(section, {})[field] = value
    return spec


def unsupported_ray_environment(environ: Mapping[str, str]) -> list[str]:
    """Ray Serve's variables set in ``environ`` that Modelplex has no equivalent for (to warn of)."""
    return sorted(name for name in environ if name.startswith("RAY_SERVE_") and name not in RAY_ENVIRONMENT)


def manifest(node: Node, *, image: str, handler: str, env: dict[str, str] | None = None,
             environ: Mapping[str, str] | None = None, app_name: str | None = None,
             app: Sequence[Node] = (), application: str | None = None) -> dict[str, Any]:
    """The MultiplexedDeployment of ``node``: replicas and resources from its options, batching
    and multiplexing from its decorators, its edges (the deployments it calls) an annotation;
    Ray's environment variables in ``environ`` that have an equivalent in the spec set it.
    ``app_name`` scopes its name and its edges' (:func:`scoped`) and labels it. The other nodes
    of ``app`` (the application built with it) are its callers (``spec.router.callers``): each
    deployment's handles use its own credential, which the others' routers accept.
    ``application`` (else ``app_name``, else "default") is the application's name its replicas
    report (``serve.get_replica_context().app_name``)."""
    spec: dict[str, Any] = {**node.options.replica_spec(), "image": image, "handler": handler,
                            **decorated(node.target), "http": {"request": "starlette"}}  # Ray's HTTP contract
    for section, fields in ray_environment(environ or {}).items():
        spec[section] = {**spec.get(section, {}), **fields}
    if node.options.max_ongoing_requests is not None:
        spec["maxOngoingRequests"] = node.options.max_ongoing_requests
    resources = node.options.resources()
    if resources:
        spec["resources"] = resources
    if node.options.health_check():
        spec["healthCheck"] = node.options.health_check()
    if node.options.graceful_shutdown_timeout_s is not None:
        spec["gracefulShutdownTimeoutSeconds"] = node.options.graceful_shutdown_timeout_s
    spec.update(node.options.spec())  # logging, router.accessLog and router.maxQueuedRequests
    env = {**node.options.env(), ENV_DEPLOYMENT: node.options.name,
           ENV_APPLICATION: application or app_name or DEFAULT_APPLICATION, **(env or {})}
    spec["env"] = [{"name": key, "value": value} for key, value in env.items()]
    callers = sorted({scoped(app_name, other.name) for other in app if other.name != node.name})
    if callers:
        spec["router"] = {**spec.get("router", {}), "callers": callers}
    metadata: dict[str, Any] = {"name": scoped(app_name, node.name)}
    if app_name:
        metadata["labels"] = {LABEL_APP: dns_label(app_name)}
    if node.edges:
        metadata["annotations"] = {ANNOTATION_HANDLES: ",".join(scoped(app_name, edge) for edge in node.edges)}
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}
