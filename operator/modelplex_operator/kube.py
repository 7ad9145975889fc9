"""The operator's thin Kubernetes client: server-side apply of owned objects, status patches.

kopf watches and posts Events with its own client; the objects the operator makes are written
here with the ``kubernetes`` client (in a worker thread, so the event loop never blocks):

- :meth:`Kube.apply` is create-or-update, idempotent: a new object is one create (``POST``); an
  existing one is read, refused when it is not the operator's (one another controller owns, or
  one without the operator's labels: :func:`check_ownership`), left alone when it is in step
  (``applied.in_step``: a steady-state reconcile writes nothing), else server-side applied with
  the field manager ``modelplex-operator`` and ``force``. Fields the operator stopped setting are
  removed; fields others set (the Service's cluster IP, a human's extra annotation) are kept.
  Creating first makes a burst of new deployments cost one call per object instead of two; the
  ownership rule is the same, since a create never overwrites (409 when the name is taken).
- :meth:`Kube.patch_status` writes a MultiplexedDeployment's status subresource.

Errors come out as :class:`KubeError` with ``retryable`` saying whether trying again may help:
an answer of the API server, or no answer at all (the network, a timeout). Anything else the
client raises (a bad argument, an object it cannot serialize) is a bug and leaves as it is.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
from dataclasses import dataclass
from typing import Any

import urllib3.exceptions

from modelplex.wire.names import API_GROUP, API_VERSION, LABEL_DEPLOYMENT, PLURAL
from modelplex_operator import FIELD_MANAGER, MANAGED_BY, applied

log = logging.getLogger("modelplex.operator.kube")

#: (apiVersion, kind) -> plural of the namespaced kinds the operator writes.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Pod"): "pods",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("apps/v1", "Deployment"): "deployments",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    (f"{API_GROUP}/{API_VERSION}", "MultiplexedDeployment"): PLURAL,
    # The Gateway API Inference Extension's (its CRD may be missing: modelplex_operator.pools).
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
}
#: ``status`` of a request the server never answered (the network, a timeout): worth a retry.
NO_ANSWER = 0
#: Answers after which the same request may succeed later, besides every 5xx: a conflict with
#: another writer (409), throttling (429), the server's request timeout (408), and 403, since
#: RBAC is granted apart from the resource (an administrator fixing the operator's role heals
#: it). Anything else (400, 404, 422 ...) fails the same way until the spec or the cluster changes.
RETRYABLE = frozenset({NO_ANSWER, 403, 408, 409, 429})
REQUEST_TIMEOUT_S = 30
#: Reads and tries of the patch that hands a create's fields to the apply (see ``Kube._adopt``).
ADOPT_TRIES = 3
#: What the ``kubernetes`` client (urllib3 underneath) raises when no answer came back.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable, socket timeouts, ssl.SSLError
    http.client.HTTPException,
    urllib3.exceptions.MaxRetryError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.TimeoutError,  # connect and read timeouts, name resolution
    urllib3.exceptions.SSLError,
    urllib3.exceptions.ProxyError,
)


class KubeError(Exception):
    """A failed API call: ``status`` (:data:`NO_ANSWER` for none), ``reason`` and the server's message."""

    def __init__(self, status: int, reason: str, message: str, what: str = ""):
        self.status = status
        self.reason = reason
        self.message = message
        self.what = what
        where = f"{what}: " if what else ""
        super().__init__(f"{where}{status or 'no answer'} {reason}: {message}".strip())

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later (see :data:`RETRYABLE`)."""
        return self.status in RETRYABLE or self.status >= 500


class NotOwned(Exception):
    """An object the operator would make exists and is controlled by something else."""


@dataclass(frozen=True)
class ApplyResult:
    action: str  # "created", "updated" or "unchanged"
    before: dict[str, Any] | None
    after: dict[str, Any]


def object_path(api_version: str, kind: str, namespace: str, name: str = "", subresource: str = "") -> str:
    """The API path of a namespaced object (or of its collection when ``name`` is empty)."""
    try:
        plural = PLURALS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not write {kind} ({api_version})") from None
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def controller_of(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """The owner reference with ``controller: true``, if any."""
    for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return ref
    return None


def made_by_modelplex(obj: dict[str, Any] | None) -> bool:
    """Whether ``obj`` carries the operator's ``app.kubernetes.io/managed-by`` label."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY


def foreign(what: str, labels: dict[str, str] | None = None) -> NotOwned:
    """The refusal for an object of that name that the operator did not make; ``labels`` are
    what hands it over (the managed-by label by default)."""
    labels = labels or {"app.kubernetes.io/managed-by": MANAGED_BY}
    handover = ", ".join(f"{key}={value}" for key, value in labels.items())
    return NotOwned(f"{what} exists and was not made by Modelplex: left as it is (remove it, or label it "
                    f"{handover} to hand it over)")


def check_ownership(existing: dict[str, Any] | None, desired: dict[str, Any], owner_uid: str, what: str) -> None:
    """Refuse to take over an object that is not the operator's for this resource.

    Its own (controlled by ``owner_uid``) it updates. An object another controller (or an
    earlier resource of that name) controls is refused. One without a controller is adopted
    only when it carries the operator's labels for this resource (an earlier operator version,
    or a person handing it over); anything else of that name is someone else's and left alone.
    """
    if existing is None:
        return
    ref = controller_of(existing)
    if ref is not None:
        if ref.get("uid") != owner_uid:
            raise NotOwned(
                f"{what} exists and is controlled by {ref.get('kind')} {ref.get('name')} "
                f"(uid {ref.get('uid')}); delete or rename it"
            )
        return
    labels = (existing.get("metadata") or {}).get("labels") or {}
    deployment = ((desired.get("metadata") or {}).get("labels") or {}).get(LABEL_DEPLOYMENT)
    if not made_by_modelplex(existing) or (deployment is not None and labels.get(LABEL_DEPLOYMENT) != deployment):
        ours = {"app.kubernetes.io/managed-by": MANAGED_BY, **({LABEL_DEPLOYMENT: deployment} if deployment else {})}
        raise foreign(what, ours)


def error_from_api_exception(error: Exception, what: str = "") -> KubeError:
    status = int(getattr(error, "status", 0) or 0)
    reason = str(getattr(error, "reason", "") or "")
    body = getattr(error, "body", None)
    message = ""
    if body:
        try:
            document = json.loads(body)
            message = document.get("message", "") if isinstance(document, dict) else str(document)
            reason = (document.get("reason") if isinstance(document, dict) else None) or reason
        except (TypeError, ValueError):
            message = str(body)[:500]
    return KubeError(status, reason, message or str(error), what)


class Kube:
    """A few typed-free calls on top of ``kubernetes.client.ApiClient`` (JSON in, JSON out)."""

    def __init__(self, api_client: Any, field_manager: str = FIELD_MANAGER, timeout: float = REQUEST_TIMEOUT_S):
        self.api_client = api_client
        self.field_manager = field_manager
        self.timeout = timeout
        #: (apiVersion, kind, namespace, name) of the objects :meth:`apply` has seen exist: read
        #: before they are written; any other is created first (see :meth:`apply`).
        self._seen: set[tuple[str, str, str, str]] = set()

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster credentials, else ``$KUBECONFIG`` / ``~/.kube/config``."""
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.ApiClient())

    def close(self) -> None:
        close = getattr(self.api_client, "close", None)
        if close is not None:
            close()

    # ------------------------------------------------------------------ raw calls

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        what: str = "",
    ) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        try:
            return self.api_client.call_api(
                path,
                method,
                query_params=list(query or []),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=True,
                _request_timeout=self.timeout,
            )
        except ApiException as error:
            raise error_from_api_exception(error, what) from error
        except NETWORK_ERRORS as error:
            raise KubeError(NO_ANSWER, type(error).__name__, str(error), what) from error

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._call("GET", object_path(api_version, kind, namespace, name), what=f"get {kind} {name}")
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any], owner_uid: str) -> ApplyResult:
        """Create or update ``obj``; says whether anything changed.

        Each call is as few requests as the object's state allows: a new object is one create
        (``POST``); an existing one is a GET (the ownership check), then nothing when it is in
        step (:func:`applied.in_step`), else the adoption of a create's fields (once per object)
        and a server-side apply. An object this client has seen
        exist is read first; any other is created first, and read on 409 (it exists)."""
        meta = obj["metadata"]
        kind, name, namespace = obj["kind"], meta["name"], meta["namespace"]
        what = f"{kind} {name}"
        path = object_path(obj["apiVersion"], kind, namespace, name)
        desired = applied.with_applied_hash(obj)
        key = (obj["apiVersion"], kind, namespace, name)
        if key not in self._seen:
            created, before = self._create_or_read(desired, what)
            if created is not None:
                self._seen.add(key)
                return ApplyResult("created", None, created)
        else:
            before = self.get(obj["apiVersion"], kind, namespace, name)
        check_ownership(before, obj, owner_uid, what)
        if before is not None:
            self._seen.add(key)
            if applied.in_step(before, obj):
                # No write, not even the adoption: a restarted operator leaves a settled object as it is.
                return ApplyResult("unchanged", before, before)
            before = self._adopt(before, obj, path, what)
        after = self._call(
            "PATCH",
            path,
            body=desired,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", self.field_manager), ("force", "true")],
            what=f"apply {what}",
        )
        self._seen.add(key)
        if before is None:
            action = "created"
        elif (before.get("metadata") or {}).get("resourceVersion") != (after.get("metadata") or {}).get(
            "resourceVersion"
        ):
            action = "updated"
        else:
            action = "unchanged"
        return ApplyResult(action, before, after)

    def _adopt(self, existing: dict[str, Any], obj: dict[str, Any], path: str, what: str,
               tries: int = ADOPT_TRIES) -> dict[str, Any]:
        """Hand the fields a create left to the operator's apply (:func:`applied.adopt_created`,
        once per object); the object as it is then. The patch is guarded by the entries' places,
        which others' writes move (the controller-manager's status updates): read again and
        retry; past ``tries`` go on without it (the next apply tries again)."""
        for _ in range(tries):
            patch = applied.adopt_created(existing, self.field_manager)
            if patch is None:
                return existing
            try:
                return self._call("PATCH", path, body=patch, content_type="application/json-patch+json",
                                  query=[("fieldManager", self.field_manager)], what=f"adopt {what}")
            except KubeError as error:
                if error.status not in (409, 422):  # 422: a guard failed, the entries moved
                    raise
            meta = obj["metadata"]
            again = self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
            if again is None:
                return existing
            existing = again
        log.info("%s: the create's fields not handed to the apply yet (the object kept changing)", what)
        return existing

    def _create_or_read(self, desired: dict[str, Any], what: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """``(created, None)`` when ``desired`` was created, else ``(None, existing)``: the
        object of its name (None when it was deleted between the create and the read)."""
        meta = desired["metadata"]
        try:
            created = self._call("POST", object_path(desired["apiVersion"], desired["kind"], meta["namespace"]),
                                 body=desired, query=[("fieldManager", self.field_manager)], what=f"create {what}")
            return created, None
        except KubeError as error:
            if error.status != 409:  # 409: it exists
                raise
        return None, self.get(desired["apiVersion"], desired["kind"], meta["namespace"], meta["name"])

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj``; a 409 (it exists) raises :class:`KubeError` like any refusal."""
        meta = obj["metadata"]
        return self._call("POST", object_path(obj["apiVersion"], obj["kind"], meta["namespace"]), body=obj,
                          query=[("fieldManager", self.field_manager)], what=f"create {obj['kind']} {meta['name']}")

    def delete(self, api_version: str, kind: str, namespace: str, name: str, uid: str) -> bool:
        """Delete the object of ``uid`` (a precondition: never another object of that name);
        False when it was not there (404, its kind unknown to the server included)."""
        try:
            self._call("DELETE", object_path(api_version, kind, namespace, name),
                       body={"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}},
                       what=f"delete {kind} {name}")
        except KubeError as error:
            if error.status == 404:
                return False
            raise
        return True

    def merge_patch(self, api_version: str, kind: str, namespace: str, name: str,
                    patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of an object."""
        return self._call("PATCH", object_path(api_version, kind, namespace, name), body=patch,
                          content_type="application/merge-patch+json",
                          query=[("fieldManager", self.field_manager)], what=f"patch {kind} {name}")

    def patch_status(self, namespace: str, name: str, uid: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge ``status`` into a MultiplexedDeployment's status (only the object with ``uid``)."""
        path = object_path(f"{API_GROUP}/{API_VERSION}", "MultiplexedDeployment", namespace, name, "status")
        body = {"metadata": {"uid": uid}, "status": status}
        return self._call("PATCH", path, body=body, content_type="application/merge-patch+json",
                          what=f"status of MultiplexedDeployment {name}")

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods matching ``label_selector`` in ``namespace``."""
        document = self._call("GET", object_path("v1", "Pod", namespace), query=[("labelSelector", label_selector)],
                              what=f"list pods {label_selector}")
        return list(document.get("items") or ())

    def scale(self, namespace: str, name: str, replicas: int) -> dict[str, Any]:
        """Set a Deployment's ``replicas`` through its scale subresource."""
        path = object_path("apps/v1", "Deployment", namespace, name, "scale")
        return self._call("PATCH", path, body={"spec": {"replicas": replicas}},
                          content_type="application/merge-patch+json",
                          query=[("fieldManager", self.field_manager)], what=f"scale Deployment {name}")

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
        """Merge ``annotations`` into a pod's (``None`` removes one)."""
        return self._call("PATCH", object_path("v1", "Pod", namespace, name),
                          body={"metadata": {"annotations": annotations}},
                          content_type="application/merge-patch+json",
                          query=[("fieldManager", self.field_manager)], what=f"annotate pod {name}")

    # ------------------------------------------------------------------ async (worker thread)

    async def alist_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.list_pods, namespace, label_selector)

    async def ascale(self, namespace: str, name: str, replicas: int) -> dict[str, Any]:
        return await asyncio.to_thread(self.scale, namespace, name, replicas)

    async def aannotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
        return await asyncio.to_thread(self.annotate_pod, namespace, name, annotations)

    async def aapply(self, obj: dict[str, Any], owner_uid: str) -> ApplyResult:
        return await asyncio.to_thread(self.apply, obj, owner_uid)

    async def apatch_status(self, namespace: str, name: str, uid: str, status: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.patch_status, namespace, name, uid, status)
