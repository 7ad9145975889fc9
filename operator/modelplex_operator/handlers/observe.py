"""What the operator watches to keep each resource's status current.

Three kopf indexes, keyed by ``(namespace, resource name)``:

- the MultiplexedDeployments themselves (a plain view: metadata, spec, status);
- the replica pods (``modelplex.io/role=replica``): ready or not, and the models their
  ``modelplex.io/loaded-models`` annotation lists;
- the Deployments the operator made (``app.kubernetes.io/managed-by=modelplex-operator``).

kopf fills every index before any handler runs, so after a restart the first status is
computed from complete data. Each event on these objects pokes the status keeper, which
coalesces bursts (a replica patches its annotation after every load) into one status write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from modelplex.wire.names import API_GROUP, API_VERSION, KIND, LABEL_DEPLOYMENT
from modelplex.wire.spec import DeploymentSpec, SpecError, parse_spec
from modelplex_operator.status import DeploymentView, Key, PodView, Resource, deployment_view, pod_view
from modelplex_operator.validation import plain, problems_of, validate


def resource_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of what the operator needs of a MultiplexedDeployment (also an Event target)."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "generation": meta.get("generation"),
            "resourceVersion": meta.get("resourceVersion"),
            "deletionTimestamp": meta.get("deletionTimestamp"),
        },
        "spec": plain(body.get("spec") or {}),
        "status": plain(body.get("status") or {}),
    }


def index_resource(body: Mapping[str, Any], namespace: str, name: str) -> dict[Key, dict[str, Any]]:
    return {(namespace, name): resource_view(body)}


def index_replica_pod(body: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> dict[Key, PodView] | None:
    owner = labels.get(LABEL_DEPLOYMENT)
    return {(namespace, owner): pod_view(body)} if owner else None


def index_deployment(body: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> dict[Key, DeploymentView] | None:
    owner = labels.get(LABEL_DEPLOYMENT)
    return {(namespace, owner): deployment_view(body)} if owner else None


def owner_key(namespace: str, labels: Mapping[str, str]) -> Key | None:
    owner = labels.get(LABEL_DEPLOYMENT)
    return (namespace, owner) if owner else None


@dataclass
class Indexes:
    """The three indexes (kopf's ``Index`` objects, or plain mappings in tests)."""

    resources: Mapping[Key, Iterable[dict[str, Any]]]
    pods: Mapping[Key, Iterable[PodView]]
    deployments: Mapping[Key, Iterable[DeploymentView]]

    def resource(self, key: Key) -> dict[str, Any] | None:
        views = list(self.resources.get(key) or ())
        return views[-1] if views else None

    def resource_keys(self) -> list[Key]:
        return list(self.resources.keys())

    def pods_of(self, key: Key) -> list[PodView]:
        return list(self.pods.get(key) or ())

    def deployments_of(self, key: Key) -> list[DeploymentView]:
        return list(self.deployments.get(key) or ())


def read_spec(view: Mapping[str, Any]) -> tuple[DeploymentSpec | None, str]:
    """The resource's spec, parsed once with the spec module's model (its defaults filled in),
    and what validation found wrong with the resource (``""``: nothing). The spec is ``None``
    only when it does not parse itself."""
    try:
        return validate(view).spec, ""
    except SpecError as error:
        problem = problems_of(error)
    # Only on this path is the spec read again: a name the cluster cannot use leaves a spec that
    # parses, and the status still shows the router port and counts it asks for.
    try:
        return parse_spec(plain(view.get("spec") or {})), problem
    except SpecError:
        return None, problem


def resource_of(view: Mapping[str, Any], spec: DeploymentSpec | None = None, spec_problem: str = "") -> Resource:
    """What status needs of a resource view (:func:`resource_view`) and its spec parsed by :func:`read_spec`."""
    meta = view.get("metadata") or {}
    return Resource(
        name=meta.get("name") or "",
        namespace=meta.get("namespace") or "default",
        uid=meta.get("uid") or "",
        generation=int(meta.get("generation") or 1),
        spec=spec,
        status=view.get("status") or {},
        deleting=bool(meta.get("deletionTimestamp")),
        spec_problem=spec_problem,
    )
