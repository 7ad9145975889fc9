"""The objects the operator makes for a MultiplexedDeployment, as pure functions.

For a resource named N (DESIGN.md, "What the operator makes"), all owned by it and labelled
``modelplex.io/deployment=N`` plus the ``app.kubernetes.io/*`` labels:

- ServiceAccounts ``N-replica`` and ``N-router``;
- Roles and RoleBindings ``N-replica`` (pods patch: a replica patches its own annotation; the
  chart's ValidatingAdmissionPolicy narrows it to that annotation of its own pod) and
  ``N-router`` (pods get/list/watch: the router watches the replica pods);
- ConfigMap ``N-spec`` holding the spec the pods read (``spec.yaml``);
- with ``spec.autoscaling``, ConfigMap ``N-hot-models`` (the models a new replica pre-loads),
  made and kept current by the autoscaler (:mod:`modelplex_operator.handlers.autoscale`), not
  by the reconcile: the replica pods mount it as an optional volume;
- Service ``N`` in front of the router pods;
- Deployments ``N-replica`` (``modelplex replica``) and ``N-router`` (``modelplex router``);
- PodDisruptionBudgets ``N-replica`` and ``N-router`` (a drain takes one pod of each at a time);
- with ``spec.router.endpointPicker.enabled``, an ``InferencePool`` ``N``
  (:func:`inference_pool`: the Gateway API Inference Extension's, applied apart from the list
  since its CRD may not be installed: :mod:`modelplex_operator.pools`).

The list is in apply order: what a pod needs exists before the pod. Every function here is
pure (no I/O, no clock), so the whole desired state is unit-tested without a cluster.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import yaml

from modelplex.wire.credentials import (CALLER_TOKENS_MOUNT, CLIENT_TOKENS_MOUNT, ENV_CALLER_TOKENS_DIR,
                                        ENV_CLIENT_TOKENS_DIR, ENV_INTERNAL_TOKEN_FILE, ENV_LEGACY_TOKEN_FILE,
                                        INTERNAL_SECRET_KEY, INTERNAL_TOKEN_MOUNT, LEGACY_SECRET_KEY,
                                        internal_secret_name)
from modelplex.wire.load import ENV_PRELOAD_FILE, HOT_MODELS_KEY, format_hot_models
from modelplex.wire.names import (API_GROUP, API_VERSION, ENV_POD_IP, ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_SOURCE_URI,
                                  ENV_SPEC, ENV_WARM_DIR, KIND, LABEL_DEPLOYMENT, LABEL_ROLE, PORT_NAME,
                                  REPLICA_CONTROL_PORT, REPLICA_PORT, ROLE_REPLICA, ROLE_ROUTER)
from modelplex.wire.spec import (DEFAULT_ENDPOINT_PICKER_PORT, DEFAULT_ROUTER_CONTROL_PORT, DEFAULT_ROUTER_GRPC_PORT,
                                 Deployment, Multiplexing, to_manifest)
from modelplex_operator import MANAGED_BY
from modelplex_operator.config import DEFAULT_ROUTER_IMAGE

#: The pod template annotation whose change rolls the pods.
ANNOTATION_SPEC_HASH = "modelplex.io/spec-hash"
SPEC_MOUNT = "/etc/modelplex"
SPEC_FILE = "spec.yaml"
SPEC_PATH = f"{SPEC_MOUNT}/{SPEC_FILE}"
SPEC_VOLUME = "spec"
#: A replica's and a router's probes and metrics (modelplex_replica.control, modelplex_router.control):
#: the kubelet probes it, the chart's PodMonitor and ServiceMonitor scrape it.
CONTROL_PORT_NAME = "control"
#: The router's Open Inference Protocol over gRPC (container and Service port).
GRPC_PORT_NAME = "grpc"
#: The router's Endpoint Picker (ext_proc and grpc.health.v1; container and Service port).
PICKER_PORT_NAME = "picker"
#: The Gateway API Inference Extension's pool, which names the picker to a Gateway.
INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"
INFERENCE_POOL_KIND = "InferencePool"
#: Before SIGTERM, a pod being deleted waits this long (preStop) while Service endpoints and
#: routers stop sending to it; then the process drains for gracefulShutdownTimeoutSeconds.
PRE_STOP_S = 5
#: Past the drain, for the process to cancel what is left and exit before the kubelet's SIGKILL.
EXIT_MARGIN_S = 5
COMPONENT_SPEC = "spec"
COMPONENT_INFERENCE_POOL = "inference-pool"
COMPONENT_CREDENTIAL = "credential"
#: On ``N-internal`` while the deployment upgrades from a namespace credential (then ``done``).
ANNOTATION_CREDENTIAL_UPGRADE = "modelplex.io/credential-upgrade"
#: How long the kubelet waits for a replica's /readyz: a loaded node's margin (see its probe).
REPLICA_READINESS_TIMEOUT_S = 5
#: The CPU warm tier's disk copies of fetched models (``spec.multiplexing.hostCacheBytes``).
WARM_VOLUME = "warm-models"
WARM_MOUNT = "/var/cache/modelplex/warm"
#: The hot-models ConfigMap: one file, the model ids a starting replica loads before it is ready.
COMPONENT_HOT_MODELS = "hot-models"
HOT_MODELS_VOLUME = "hot-models"
HOT_MODELS_MOUNT = "/etc/modelplex-hot-models"
HOT_MODELS_FILE = HOT_MODELS_KEY
HOT_MODELS_PATH = f"{HOT_MODELS_MOUNT}/{HOT_MODELS_FILE}"


@dataclass(frozen=True)
class BuildSettings:
    """What the builders need beyond the resource: the operator's own settings."""

    router_image: str = DEFAULT_ROUTER_IMAGE
    image_pull_policy: str = ""
    #: The operator's namespace ("" : any) and who may scrape the replicas' metrics (NetworkPolicy peers).
    operator_namespace: str = ""
    metrics_from: tuple[dict[str, Any], ...] = ()


# --------------------------------------------------------------------------- names and labels


def replica_name(name: str) -> str:
    return f"{name}-{ROLE_REPLICA}"


def router_name(name: str) -> str:
    return f"{name}-{ROLE_ROUTER}"


def config_map_name(name: str) -> str:
    return f"{name}-{COMPONENT_SPEC}"


def hot_models_config_map_name(name: str) -> str:
    return f"{name}-{COMPONENT_HOT_MODELS}"


def service_name(name: str) -> str:
    return name


def labels(name: str, component: str) -> dict[str, str]:
    """The labels of every object made for resource ``name``."""
    return {
        "app.kubernetes.io/name": "modelplex",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "modelplex",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_DEPLOYMENT: name,
    }


def role_labels(name: str, role: str) -> dict[str, str]:
    """Labels of a replica or router object (and of its pods): the common ones plus the role."""
    return {**labels(name, role), LABEL_ROLE: role}


def selector(name: str, role: str) -> dict[str, str]:
    """The pod selector of a role: never changes (a Deployment's selector is immutable)."""
    return {LABEL_DEPLOYMENT: name, LABEL_ROLE: role}


def selector_string(name: str, role: str = ROLE_REPLICA) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(name, role).items())


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """The controller owner reference to the resource: deleting it deletes what it owns."""
    meta = body["metadata"]
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(name: str, namespace: str, object_labels: dict[str, str], owner: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(object_labels), "ownerReferences": [dict(owner)]}


# --------------------------------------------------------------------------- the spec and its hash


def internal_secret(deployment: Deployment, owner: dict[str, Any], token: str,
                    legacy: str | None = None) -> dict[str, Any]:
    """The deployment's internal credential (``N-internal``): a random token that its routers,
    replicas and handles share, and that the routers of the deployments listing it as a caller
    accept from it. ``legacy``: the namespace's token of an earlier version, beside it until
    the deployment's pods have rolled (:mod:`modelplex_operator.credentials`)."""
    data = {INTERNAL_SECRET_KEY: token}
    metadata = _metadata(internal_secret_name(deployment.name), deployment.namespace,
                         labels(deployment.name, COMPONENT_CREDENTIAL), owner)
    if legacy is not None:
        data[LEGACY_SECRET_KEY] = legacy
        metadata["annotations"] = {ANNOTATION_CREDENTIAL_UPGRADE: "accepting"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


def spec_document(deployment: Deployment) -> str:
    """The ConfigMap's ``spec.yaml``: the deployment in the manifest form the pods read, with no
    value from ``env`` or a Secret (the routers mount it too): ``env`` reaches the replicas as
    their container's environment, and a source URI's user and password (an existing
    deployment's: new ones are refused) as :data:`~modelplex.wire.names.ENV_SOURCE_URI`."""
    manifest = to_manifest(deployment)
    spec = manifest["spec"]
    spec.pop("env", None)
    source = deployment.spec.model_source
    if source is not None and source.has_userinfo:
        spec["modelSource"] = {**spec["modelSource"], "uri": source.uri_without_userinfo}
    return yaml.safe_dump(manifest, sort_keys=True)


def spec_hash(deployment: Deployment) -> str:
    """A hash of everything a pod reads, but not of the replica counts or the autoscaling
    settings: scaling, and tuning how it scales, roll nothing. (Turning autoscaling on or off
    does: the replica pods gain or lose the hot-models volume.) Nor of what only the
    InferencePool and the NetworkPolicies read (the picker's failure mode, the Gateway's peers).
    Nor of ``userConfig``: the operator sends a new one to the live replicas (Ray's reconfigure,
    :mod:`modelplex_operator.user_config`); a new pod reads it from the ConfigMap."""
    manifest = to_manifest(deployment)
    spec = dict(manifest["spec"])
    spec.pop("replicas", None)
    spec.pop("autoscaling", None)
    spec.pop("userConfig", None)
    router = {k: v for k, v in dict(spec.get("router") or {}).items() if k != "replicas"}
    if "endpointPicker" in router:
        router["endpointPicker"] = {k: v for k, v in dict(router["endpointPicker"]).items()
                                    if k not in ("failureMode", "gatewayFrom")}
    spec["router"] = router
    canonical = json.dumps({"metadata": manifest["metadata"], "spec": spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- objects


def _per_role(deployment: Deployment, owner: dict[str, Any], api_version: str, kind: str,
              body: Callable[[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """One object of ``kind`` for each role (replica, router), named after the role's objects;
    ``body(role, object_name)`` gives the fields beyond the metadata."""
    name, ns = deployment.name, deployment.namespace
    return [
        {"apiVersion": api_version, "kind": kind,
         "metadata": _metadata(object_name, ns, role_labels(name, role), owner), **body(role, object_name)}
        for role, object_name in ((ROLE_REPLICA, replica_name(name)), (ROLE_ROUTER, router_name(name)))
    ]


def service_accounts(deployment: Deployment, owner: dict[str, Any]) -> list[dict[str, Any]]:
    return _per_role(deployment, owner, "v1", "ServiceAccount", lambda role, object_name: {})


#: Least privilege: a replica patches pods and reads none (RBAC cannot name a pod that does not
#: exist yet: the chart's ValidatingAdmissionPolicy lets a replica's token change only the
#: loaded-models annotation of the pod it is bound to); the router reads and watches the replica pods.
ROLE_RULES: dict[str, list[dict[str, Any]]] = {
    ROLE_REPLICA: [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}],
    ROLE_ROUTER: [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
}


def roles(deployment: Deployment, owner: dict[str, Any]) -> list[dict[str, Any]]:
    return _per_role(deployment, owner, "rbac.authorization.k8s.io/v1", "Role",
                     lambda role, object_name: {"rules": [dict(rule) for rule in ROLE_RULES[role]]})


def role_bindings(deployment: Deployment, owner: dict[str, Any]) -> list[dict[str, Any]]:
    return _per_role(deployment, owner, "rbac.authorization.k8s.io/v1", "RoleBinding", lambda role, object_name: {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": object_name},
        "subjects": [{"kind": "ServiceAccount", "name": object_name, "namespace": deployment.namespace}],
    })


def _config_map(deployment: Deployment, owner: dict[str, Any], object_name: str, component: str,
                data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(object_name, deployment.namespace, labels(deployment.name, component), owner),
        "data": data,
    }


def config_map(deployment: Deployment, owner: dict[str, Any]) -> dict[str, Any]:
    return _config_map(deployment, owner, config_map_name(deployment.name), COMPONENT_SPEC,
                       {SPEC_FILE: spec_document(deployment)})


def hot_models_config_map(deployment: Deployment, owner: dict[str, Any], models: Sequence[str]) -> dict[str, Any]:
    """ConfigMap ``N-hot-models``: the models a new replica pre-loads before it reports Ready."""
    return _config_map(deployment, owner, hot_models_config_map_name(deployment.name), COMPONENT_HOT_MODELS,
                       {HOT_MODELS_FILE: format_hot_models(models)})


def replica_count(deployment: Deployment, current: int | None = None) -> int:
    """The replica Deployment's ``replicas``. Without autoscaling, ``spec.replicas`` (unset: 1).
    With it the autoscaler owns the count: ``current`` (what it last wrote, kept as it is so an
    apply never undoes a scaling decision) within the bounds, else its starting point."""
    bounds = deployment.spec.autoscaling
    if bounds is None or current is None:
        return deployment.spec.starting_replicas
    return min(max(current, bounds.min_replicas), bounds.max_replicas)


def service(deployment: Deployment, owner: dict[str, Any]) -> dict[str, Any]:
    name, ns = deployment.name, deployment.namespace
    port = deployment.spec.router.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(name), ns, role_labels(name, ROLE_ROUTER), owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(name, ROLE_ROUTER),
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"},
                      {"name": GRPC_PORT_NAME, "port": grpc_port(deployment), "targetPort": GRPC_PORT_NAME,
                       "protocol": "TCP"},
                      # For the chart's ServiceMonitor (the routers' metrics are on this port only).
                      {"name": CONTROL_PORT_NAME, "port": router_control_port(deployment),
                       "targetPort": CONTROL_PORT_NAME, "protocol": "TCP"},
                      # The InferencePool's endpointPickerRef: what a Gateway asks.
                      *_picker_ports(deployment, "port", "targetPort")],
        },
    }


def picker_port(deployment: Deployment) -> int | None:
    """The router's Endpoint Picker port in pods: ``spec.router.endpointPicker.port``, else 9002;
    None while the picker is off."""
    picker = deployment.spec.router.endpoint_picker
    if not picker.enabled:
        return None
    return picker.port or DEFAULT_ENDPOINT_PICKER_PORT


def _picker_ports(deployment: Deployment, number_key: str, name_key: str = "") -> list[dict[str, Any]]:
    """The picker's named port, as a container or a Service lists it ([] while the picker is off)."""
    port = picker_port(deployment)
    if port is None:
        return []
    target = {name_key: PICKER_PORT_NAME} if name_key else {}
    return [{"name": PICKER_PORT_NAME, number_key: port, **target, "protocol": "TCP"}]


def inference_pool(deployment: Deployment, owner: dict[str, Any]) -> dict[str, Any] | None:
    """The ``InferencePool`` ``N`` (``inference.networking.k8s.io/v1``) a Gateway routes to: the
    replica pods on their API port, picked by the routers' Endpoint Picker behind Service ``N``;
    None while the picker is off."""
    port = picker_port(deployment)
    if port is None:
        return None
    name, ns = deployment.name, deployment.namespace
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": INFERENCE_POOL_KIND,
        "metadata": _metadata(service_name(name), ns, labels(name, COMPONENT_INFERENCE_POOL), owner),
        "spec": {
            "selector": {"matchLabels": selector(name, ROLE_REPLICA)},
            "targetPorts": [{"number": REPLICA_PORT}],
            "endpointPickerRef": {
                "group": "", "kind": "Service", "name": service_name(name), "port": {"number": port},
                "failureMode": deployment.spec.router.endpoint_picker.failure_mode,
            },
        },
    }


def grpc_port(deployment: Deployment) -> int:
    """The router's gRPC port in pods: ``spec.router.grpcPort``, else 8001 (Triton's)."""
    return deployment.spec.router.grpc_port or DEFAULT_ROUTER_GRPC_PORT


def router_control_port(deployment: Deployment) -> int:
    """The router's control port in pods (probes, metrics): ``spec.router.controlPort``, else 9091."""
    return deployment.spec.router.control_port or DEFAULT_ROUTER_CONTROL_PORT


def _downward_env() -> list[dict[str, Any]]:
    def field(env_name: str, path: str) -> dict[str, Any]:
        return {"name": env_name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    return [
        {"name": ENV_SPEC, "value": SPEC_PATH},
        field(ENV_POD_NAME, "metadata.name"),
        field(ENV_POD_NAMESPACE, "metadata.namespace"),
        field(ENV_POD_IP, "status.podIP"),
    ]


def _probe(path: str, *, period: int, failures: int, timeout: int = 2, initial_delay: int = 0,
           port: str = PORT_NAME) -> dict[str, Any]:
    probe = {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }
    if initial_delay:
        probe["initialDelaySeconds"] = initial_delay
    return probe


_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}
#: The root filesystem is read-only: /tmp (torch, multiprocessing, user code) is an emptyDir.
TMP_VOLUME = "tmp"
_TMP_MOUNT = {"name": TMP_VOLUME, "mountPath": "/tmp"}
#: The restricted Pod Security Standard asks for the runtime's default seccomp profile too.
#: fsGroup: the mounted Secrets (mode 0440) are readable by the pod's user through its group.
_NON_ROOT = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
             "seccompProfile": {"type": "RuntimeDefault"}}
#: The deployment's internal credential (routers and replicas), a router's client tokens and
#: its callers' credentials.
INTERNAL_VOLUME = "internal-credential"
CLIENT_TOKENS_VOLUME = "client-tokens"
CALLERS_VOLUME = "callers"


def _source_uri_env(deployment: Deployment) -> list[dict[str, Any]]:
    """A source URI with a user and password reaches the replicas here, never the spec ConfigMap."""
    source = deployment.spec.model_source
    return [{"name": ENV_SOURCE_URI, "value": source.uri}] if source is not None and source.has_userinfo else []


def termination(deployment: Deployment) -> tuple[int, dict[str, Any] | None]:
    """The pod's ``terminationGracePeriodSeconds`` and its container's ``lifecycle``: a preStop
    wait, then the process's own drain (``spec.gracefulShutdownTimeoutSeconds``) and a margin.
    A grace of 0 asks for neither wait."""
    drain = math.ceil(deployment.spec.graceful_shutdown_timeout_seconds)
    if drain == 0:
        return EXIT_MARGIN_S, None
    return PRE_STOP_S + drain + EXIT_MARGIN_S, {"preStop": {"sleep": {"seconds": PRE_STOP_S}}}


def _pod_template(
    deployment: Deployment,
    role: str,
    container: dict[str, Any],
    *,
    pod_security: dict[str, Any] | None = None,
) -> dict[str, Any]:
    name = deployment.name
    grace, lifecycle = termination(deployment)
    if lifecycle is not None:
        container = {**container, "lifecycle": lifecycle}
    # Every router and replica holds its deployment's internal credential: replicas refuse their
    # API without it, routers send it, handles in replicas send it to other routers. During an
    # upgrade from a namespace credential, that one is in the same Secret (then it goes).
    container = {
        **container,
        # First: spec.env comes last, as the user's own.
        "env": [{"name": ENV_INTERNAL_TOKEN_FILE, "value": f"{INTERNAL_TOKEN_MOUNT}/{INTERNAL_SECRET_KEY}"},
                {"name": ENV_LEGACY_TOKEN_FILE, "value": f"{INTERNAL_TOKEN_MOUNT}/{LEGACY_SECRET_KEY}"},
                *container["env"]],
        "volumeMounts": [*container["volumeMounts"],
                         {"name": INTERNAL_VOLUME, "mountPath": INTERNAL_TOKEN_MOUNT, "readOnly": True}],
    }
    spec: dict[str, Any] = {
        "serviceAccountName": replica_name(name) if role == ROLE_REPLICA else router_name(name),
        "terminationGracePeriodSeconds": grace,
        "containers": [container],
        "volumes": [{"name": SPEC_VOLUME, "configMap": {"name": config_map_name(name)}},
                    {"name": TMP_VOLUME, "emptyDir": {}},
                    {"name": INTERNAL_VOLUME, "secret": {"secretName": internal_secret_name(name),
                                                         "defaultMode": 0o440}}],
    }
    if pod_security:
        spec["securityContext"] = dict(pod_security)
    return {
        "metadata": {
            "labels": role_labels(name, role),
            "annotations": {ANNOTATION_SPEC_HASH: spec_hash(deployment)},
        },
        "spec": spec,
    }


def warm_tier_volume(multiplexing: Multiplexing) -> dict[str, Any] | None:
    """The replica pod's emptyDir for the warm tier's disk copies; None when the tier is off.

    The tier keeps at most ``hostCacheBytes``, but each load in flight may write one more copy
    (up to ``hostCacheBytes``) before the oldest are removed, and the kubelet evicts a pod whose
    emptyDir outgrows ``sizeLimit``: the limit is ``hostCacheBytes`` times ``maxConcurrentLoads``
    (at least once). Beside a GPU the tier is host memory and the volume stays empty.
    """
    if not multiplexing.host_cache_bytes:
        return None
    size = multiplexing.host_cache_bytes * max(1, multiplexing.max_concurrent_loads)
    return {"name": WARM_VOLUME, "emptyDir": {"sizeLimit": str(size)}}


def _deployment_object(
    deployment: Deployment, owner: dict[str, Any], role: str, replicas: int, template: dict[str, Any]
) -> dict[str, Any]:
    name, ns = deployment.name, deployment.namespace
    object_name = replica_name(name) if role == ROLE_REPLICA else router_name(name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(object_name, ns, role_labels(name, role), owner),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(name, role)},
            # Keep the serving capacity while pods roll: a new pod first, then an old one goes.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "template": template,
        },
    }


def replica_deployment(
    deployment: Deployment, owner: dict[str, Any], settings: BuildSettings, replicas: int | None = None
) -> dict[str, Any]:
    """The replica Deployment; ``replicas``: the count the autoscaler keeps (see :func:`replica_count`)."""
    spec = deployment.spec
    container: dict[str, Any] = {
        "name": ROLE_REPLICA,
        "image": spec.image,
        "command": ["modelplex", "replica", "--control-port", str(REPLICA_CONTROL_PORT)],
        "ports": [{"name": PORT_NAME, "containerPort": REPLICA_PORT, "protocol": "TCP"},
                  {"name": CONTROL_PORT_NAME, "containerPort": REPLICA_CONTROL_PORT, "protocol": "TCP"}],
        "env": _downward_env() + _source_uri_env(deployment) + [env.model_dump(exclude_none=True) for env in spec.env],
        "volumeMounts": [{"name": SPEC_VOLUME, "mountPath": SPEC_MOUNT, "readOnly": True}, dict(_TMP_MOUNT)],
        # The control port is answered by a loop that never runs user code, so a busy replica
        # answers at once; the margins are for a node whose CPUs the models saturate: a loaded
        # replica must not leave its Service.
        "readinessProbe": _probe("/readyz", period=2, failures=3, timeout=REPLICA_READINESS_TIMEOUT_S,
                                 port=CONTROL_PORT_NAME),
        # Generous: a replica busy loading big models must not be killed for a slow answer
        # (30 s, as Ray Serve's health check).
        "livenessProbe": _probe("/healthz", period=10, failures=6, timeout=30, initial_delay=30,
                                port=CONTROL_PORT_NAME),
        "securityContext": dict(_CONTAINER_SECURITY),
    }
    if spec.model_source is not None and spec.model_source.secret_ref is not None:
        container["envFrom"] = [{"secretRef": {"name": spec.model_source.secret_ref.name}}]
    if spec.resources:
        container["resources"] = json.loads(json.dumps(spec.resources))
    if settings.image_pull_policy:
        container["imagePullPolicy"] = settings.image_pull_policy
    if spec.autoscaling is not None:
        # The hottest models, for a replica started by a scale-up to load before it is ready. A
        # ConfigMap volume (not subPath) follows the map's updates; optional: the autoscaler makes
        # the map on its first round, and a pod that finds none pre-loads nothing.
        container["env"].append({"name": ENV_PRELOAD_FILE, "value": HOT_MODELS_PATH})
        container["volumeMounts"].append({"name": HOT_MODELS_VOLUME, "mountPath": HOT_MODELS_MOUNT, "readOnly": True})
    warm = warm_tier_volume(spec.multiplexing)
    if warm is not None:
        container["env"].append({"name": ENV_WARM_DIR, "value": WARM_MOUNT})
        container["volumeMounts"].append({"name": WARM_VOLUME, "mountPath": WARM_MOUNT})
    # The replica image (docker/replica.Dockerfile, and images built FROM it) runs as user 10001.
    template = _pod_template(deployment, ROLE_REPLICA, container, pod_security=_NON_ROOT)
    if warm is not None:
        template["spec"]["volumes"].append(warm)
    if spec.autoscaling is not None:
        template["spec"]["volumes"].append({
            "name": HOT_MODELS_VOLUME,
            "configMap": {"name": hot_models_config_map_name(deployment.name), "optional": True},
        })
    return _deployment_object(deployment, owner, ROLE_REPLICA, replica_count(deployment, replicas), template)


def router_deployment(deployment: Deployment, owner: dict[str, Any], settings: BuildSettings) -> dict[str, Any]:
    spec = deployment.spec
    port = spec.router.port
    grpc = grpc_port(deployment)
    control = router_control_port(deployment)
    picker = picker_port(deployment)
    container: dict[str, Any] = {
        "name": ROLE_ROUTER,
        "image": settings.router_image,
        "command": ["modelplex", "router"],
        "args": ["--port", str(port), "--grpc-port", str(grpc), "--control-port", str(control),
                 *(["--picker-port", str(picker)] if picker is not None else [])],
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"},
                  {"name": GRPC_PORT_NAME, "containerPort": grpc, "protocol": "TCP"},
                  {"name": CONTROL_PORT_NAME, "containerPort": control, "protocol": "TCP"},
                  *_picker_ports(deployment, "containerPort")],
        "env": _downward_env(),
        "volumeMounts": [{"name": SPEC_VOLUME, "mountPath": SPEC_MOUNT, "readOnly": True}, dict(_TMP_MOUNT)],
        # The router is ready while a replica is: a Service never sends to a router with none. Both
        # probes ask the control port, which has connections of its own: a public port full of idle
        # or slow clients never makes the kubelet restart the router or take it out of its Service.
        "readinessProbe": _probe("/readyz", period=2, failures=3, port=CONTROL_PORT_NAME),
        "livenessProbe": _probe("/healthz", period=10, failures=3, initial_delay=10, port=CONTROL_PORT_NAME),
        "securityContext": dict(_CONTAINER_SECURITY),
    }
    if settings.image_pull_policy:
        container["imagePullPolicy"] = settings.image_pull_policy
    if spec.router.auth is not None:
        container["env"].append({"name": ENV_CLIENT_TOKENS_DIR, "value": CLIENT_TOKENS_MOUNT})
        container["volumeMounts"].append({"name": CLIENT_TOKENS_VOLUME, "mountPath": CLIENT_TOKENS_MOUNT,
                                          "readOnly": True})
    if spec.router.callers:
        container["env"].append({"name": ENV_CALLER_TOKENS_DIR, "value": CALLER_TOKENS_MOUNT})
        container["volumeMounts"].append({"name": CALLERS_VOLUME, "mountPath": CALLER_TOKENS_MOUNT, "readOnly": True})
    # The router image is ours (docker/router.Dockerfile): it runs as a non-root user.
    template = _pod_template(
        deployment, ROLE_ROUTER, container,
        pod_security=_NON_ROOT,
    )
    if spec.router.auth is not None:
        # A Secret volume follows the Secret's updates: new tokens apply without a restart.
        template["spec"]["volumes"].append({"name": CLIENT_TOKENS_VOLUME, "secret": {
            "secretName": spec.router.auth.secret_ref.name, "defaultMode": 0o440}})
    if spec.router.callers:
        template["spec"]["volumes"].append(callers_volume(spec.router.callers))
    return _deployment_object(deployment, owner, ROLE_ROUTER, spec.router.replicas, template)


def callers_volume(callers: Sequence[str]) -> dict[str, Any]:
    """The callers' credentials for the router: one file per calling deployment, named after it,
    from its ``N-internal`` (optional: a caller made later appears when its Secret does, and a
    projected volume follows the Secrets' updates, so a rotation needs no restart)."""
    return {"name": CALLERS_VOLUME, "projected": {"defaultMode": 0o440, "sources": [
        {"secret": {"name": internal_secret_name(caller), "optional": True,
                    "items": [{"key": INTERNAL_SECRET_KEY, "path": caller}]}} for caller in callers]}}


def disruption_budgets(deployment: Deployment, owner: dict[str, Any]) -> list[dict[str, Any]]:
    """One PodDisruptionBudget per role: a node drain evicts one replica (or router) pod at a
    time, each draining its requests first. ``maxUnavailable`` rather than ``minAvailable``, so a
    deployment of one pod can still be drained; pods not yet ready may always be evicted."""
    name, ns = deployment.name, deployment.namespace
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _metadata(object_name, ns, role_labels(name, role), owner),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": selector(name, role)},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        }
        for role, object_name in ((ROLE_REPLICA, replica_name(name)), (ROLE_ROUTER, router_name(name)))
    ]


#: The operator's pods, as the chart labels them.
OPERATOR_POD_LABELS = {"app.kubernetes.io/component": "operator", "app.kubernetes.io/part-of": "modelplex"}


def network_policies(deployment: Deployment, owner: dict[str, Any], settings: BuildSettings) -> list[dict[str, Any]]:
    """``spec.networkPolicy``: ingress to the replicas (and with ``strict`` the routers) from
    whom they serve only. ``none`` writes an allow-all policy in place of a restrictive one (the
    operator deletes nothing). Egress is never restricted: the apiserver and model stores.

    With the Endpoint Picker on, ``endpointPicker.gatewayFrom`` (the Gateway's data plane) may
    reach the replicas' API port and the routers' picker port, and nobody else gains anything:
    the picker port is left out of every other rule of the routers (``replicas`` too), so no
    other client can ask the picker for a replica's proof. ``none`` stays open."""
    mode = deployment.spec.network_policy.mode
    # The operator's pods in its own namespace. Unknown, a peer without a namespaceSelector: the
    # deployment's own namespace, never every namespace (anyone could label a pod "operator").
    operator: dict[str, Any] = {"podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
    if settings.operator_namespace:
        operator["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}}
    api_peers = [{"podSelector": {"matchLabels": selector(deployment.name, ROLE_ROUTER)}}, operator]
    replica_rules = [{"from": api_peers, "ports": [{"port": REPLICA_PORT, "protocol": "TCP"}]}]
    if settings.metrics_from:  # scrapers, on the control port (the kubelet's probes come from the node)
        replica_rules.append({"from": list(settings.metrics_from),
                              "ports": [{"port": REPLICA_CONTROL_PORT, "protocol": "TCP"}]})
    picker = picker_port(deployment)
    gateway = list(deployment.spec.router.endpoint_picker.gateway_from) if picker is not None else []
    if gateway:  # the Gateway's data plane sends each request to the replica the picker chose
        replica_rules.append({"from": gateway, "ports": [{"port": REPLICA_PORT, "protocol": "TCP"}]})
    # Every port of the routers but the picker's (with it off: no port list, every port).
    public: dict[str, Any] = {} if picker is None else {"ports": [
        {"port": number, "protocol": "TCP"}
        for number in (deployment.spec.router.port, grpc_port(deployment), router_control_port(deployment))]}
    # Pods of the namespace: its own clients, and handles in other deployments' replicas.
    router_rules: list[dict[str, Any]] = [{"from": [{"podSelector": {}}], **public}]
    if settings.metrics_from:  # scrapers from elsewhere: on the control port only
        router_rules.append({"from": list(settings.metrics_from),
                             "ports": [{"port": router_control_port(deployment), "protocol": "TCP"}]})
    open_routers: list[dict[str, Any]] = [dict(public)]
    for rules_ in (router_rules, open_routers):
        if gateway:
            rules_.append({"from": gateway, "ports": [{"port": picker, "protocol": "TCP"}]})
    rules: dict[str, list[dict[str, Any]]] = {
        ROLE_REPLICA: [{}] if mode == "none" else replica_rules,
        ROLE_ROUTER: [{}] if mode == "none" else open_routers if mode == "replicas" else router_rules,
    }
    return _per_role(deployment, owner, "networking.k8s.io/v1", "NetworkPolicy", lambda role, object_name: {
        "spec": {"podSelector": {"matchLabels": selector(deployment.name, role)}, "policyTypes": ["Ingress"],
                 "ingress": rules[role]}})


def desired_objects(
    deployment: Deployment,
    owner: dict[str, Any],
    settings: BuildSettings = BuildSettings(),
    replicas: int | None = None,
) -> list[dict[str, Any]]:
    """Every object for ``deployment``, in apply order (what a pod needs comes first);
    ``replicas``: with autoscaling, the replica count the autoscaler keeps."""
    return [
        *service_accounts(deployment, owner),
        *roles(deployment, owner),
        *role_bindings(deployment, owner),
        config_map(deployment, owner),
        service(deployment, owner),
        *network_policies(deployment, owner, settings),
        replica_deployment(deployment, owner, settings, replicas),
        router_deployment(deployment, owner, settings),
        *disruption_budgets(deployment, owner),
    ]


def describe(obj: dict[str, Any]) -> str:
    """``Kind name`` of an object, for messages."""
    return f"{obj['kind']} {obj['metadata']['name']}"
