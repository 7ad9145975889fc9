"""Names shared by every component: the custom resource, labels, annotations, headers, env,
and the rule that turns a Ray deployment name into a Kubernetes one."""

import re

API_GROUP = "modelplex.io"
API_VERSION = "v1alpha1"
KIND = "MultiplexedDeployment"
PLURAL = "multiplexeddeployments"
SHORT_NAME = "mxd"

#: Ray Serve's header, so existing clients keep working.
MODEL_ID_HEADER = "serve_multiplexed_model_id"
#: The same header as proxies pass it: nginx and others drop headers with underscores.
DASHED_MODEL_ID_HEADER = "serve-multiplexed-model-id"

LABEL_DEPLOYMENT = "modelplex.io/deployment"
LABEL_ROLE = "modelplex.io/role"
ROLE_REPLICA = "replica"
ROLE_ROUTER = "router"

#: On each replica pod: the fixed-size :class:`~modelplex.wire.loaded.LoadedSummary` (JSON
#: ``{"version", "models", "loading", "capacity", "bytes", "capacityBytes"}``), never the model
#: list; a reader that sees a newer version fetches the full document from ``GET /v1/models``.
ANNOTATION_LOADED_MODELS = "modelplex.io/loaded-models"

#: A request body that works for this deployment: `modelplex local` prints it as a curl line.
ANNOTATION_EXAMPLE_REQUEST = "modelplex.io/example-request"

#: On every replica answer: the same fixed-size summary as the annotation, so the router sees a
#: change (a newer version) after each response instead of one poll or watch event behind.
LOADED_MODELS_HEADER = "X-Modelplex-Loaded-Models"

#: The spec file a pod reads (mounted from the operator's ConfigMap).
ENV_SPEC = "MODELPLEX_SPEC"
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_POD_IP = "POD_IP"
#: Where the CPU warm tier keeps its disk copies of fetched models (an emptyDir in pods).
ENV_WARM_DIR = "MODELPLEX_WARM_DIR"
#: A source URI with a user and password (an existing deployment's): the replica container's
#: environment carries it, the spec ConfigMap (which the routers mount too) only the URI without them.
ENV_SOURCE_URI = "MODELPLEX_SOURCE_URI"

REPLICA_PORT = 9000
#: A replica pod's probes and metrics (``modelplex replica --control-port``), answered while user code computes.
REPLICA_CONTROL_PORT = 9001
#: The name of a replica or router container's HTTP port (and the router Service's): the
#: operator names it, the router's Kubernetes discovery finds a replica's port by it.
PORT_NAME = "http"
# The router's ports are spec.router.port and grpcPort: their defaults are in modelplex.wire.spec
# (DEFAULT_ROUTER_PORT, DEFAULT_ROUTER_GRPC_PORT).

#: ``modelplex local`` tells every process where each deployment's router is.
ENV_ROUTER_PREFIX = "MODELPLEX_ROUTER_"


def router_env_name(deployment: str) -> str:
    """``MODELPLEX_ROUTER_<NAME>``: NAME upper-cased, ``-`` as ``_``."""
    return ENV_ROUTER_PREFIX + deployment.upper().replace("-", "_")


_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_LABEL = re.compile(r"[^a-z0-9]+")


def dns_label(name: str) -> str:
    """A Ray deployment name as a Kubernetes name: ``SimpleModel`` → ``simple-model``."""
    label = _NOT_LABEL.sub("-", _WORD_BOUNDARY.sub("-", name).lower()).strip("-")
    if not label:
        raise ValueError(f"deployment name {name!r} has no letter or digit to name it by")
    return label[:50].rstrip("-")
