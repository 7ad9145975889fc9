"""The ``InferencePool`` of a deployment whose routers serve as a Gateway's Endpoint Picker.

With ``spec.router.endpointPicker.enabled`` the operator applies the pool
(:func:`modelplex_operator.builders.inference_pool`) after the deployment's other objects, and
apart from them: the Gateway API Inference Extension's CRD is the cluster administrator's to
install, and where it is missing (the apiserver answers 404 for the kind) the ``EndpointPicker``
condition says so (False, ``CRDMissing``) with a Warning Event, and nothing else fails: the
routers serve their HTTP and gRPC fronts as ever, and the next resync applies the pool once the
CRD is there. With the picker turned off, the operator deletes the pool it made (only its own:
the owner's uid is checked, and the delete is conditioned on the pool's uid).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from modelplex.wire.spec import Deployment
from modelplex_operator import builders
from modelplex_operator.kube import ApplyResult, Kube, KubeError, NotOwned, controller_of
from modelplex_operator.status import Key

log = logging.getLogger("modelplex.operator.pools")

#: The condition on the MultiplexedDeployment (present only while the picker is on).
ENDPOINT_PICKER = "EndpointPicker"
CRD_MISSING = "CRDMissing"
POOL_APPLIED = "PoolApplied"


def picker_condition(ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": ENDPOINT_PICKER, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


def applied_condition(deployment: Deployment, generation: int) -> dict[str, Any]:
    """``EndpointPicker`` True: the pool and where a Gateway's ext_proc goes."""
    name = builders.service_name(deployment.name)
    return picker_condition(True, POOL_APPLIED, f"InferencePool {name} selects the replica pods; its Endpoint "
                            f"Picker is Service {name} port {builders.picker_port(deployment)} (failureMode "
                            f"{deployment.spec.router.endpoint_picker.failure_mode})", generation)


def failed_condition(error: KubeError | NotOwned, generation: int) -> dict[str, Any]:
    """``EndpointPicker`` False: the CRD missing (a 404 for the kind), or the apply refused."""
    if isinstance(error, KubeError) and error.status == 404:
        return picker_condition(False, CRD_MISSING, "the InferencePool CRD (inference.networking.k8s.io/v1) is "
                                "not installed: install the Gateway API Inference Extension's CRDs for a Gateway "
                                "to route through the picker (the routers serve as ever meanwhile)", generation)
    reason = "ObjectConflict" if isinstance(error, NotOwned) else "PoolNotApplied"
    return picker_condition(False, reason, f"the InferencePool was not applied: {error}", generation)


@dataclass(frozen=True)
class PoolSync:
    """What one :meth:`InferencePools.sync` came to."""

    #: The ``EndpointPicker`` condition; None while the picker is off.
    condition: dict[str, Any] | None = None
    #: The pool as applied, and the apply's result (None: nothing applied).
    pool: dict[str, Any] | None = None
    result: ApplyResult | None = None
    #: The condition turned False (or came False): worth a Warning Event.
    warn: bool = False


@dataclass
class InferencePools:
    """Applies and removes the deployments' pools; remembers each one's last condition (an Event
    only when it turns False) and which are known absent (so a deployment without the picker
    costs no API call once that is known)."""

    kube: Kube
    _absent: set[Key] = field(default_factory=set)
    _last: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def sync(self, deployment: Deployment, owner: dict[str, Any], generation: int) -> PoolSync:
        """Blocking (call it in a worker thread): apply or remove the pool of ``deployment``."""
        key: Key = (deployment.namespace, deployment.name)
        desired = builders.inference_pool(deployment, owner)
        before = self._last.pop(key, None)
        if desired is None:
            self._remove(deployment, owner, key)
            return PoolSync()
        self._absent.discard(key)
        try:
            result = self.kube.apply(desired, owner["uid"])
        except (KubeError, NotOwned) as error:
            log.info("%s/%s: InferencePool not applied: %s", *key, error)
            condition = self._last[key] = failed_condition(error, generation)
            warn = before is None or (before["status"], before["reason"]) != ("False", condition["reason"])
            return PoolSync(condition, warn=warn)
        condition = self._last[key] = applied_condition(deployment, generation)
        return PoolSync(condition, desired, result)

    def _remove(self, deployment: Deployment, owner: dict[str, Any], key: Key) -> None:
        if key in self._absent:
            return
        name = builders.service_name(deployment.name)
        api_version, kind = builders.INFERENCE_POOL_API_VERSION, builders.INFERENCE_POOL_KIND
        try:
            existing = self.kube.get(api_version, kind, deployment.namespace, name)  # None: none, or no CRD
            ref = controller_of(existing)
            if existing is not None and ref is not None and ref.get("uid") == owner["uid"]:
                self.kube.delete(api_version, kind, deployment.namespace, name, existing["metadata"]["uid"])
                log.info("%s/%s: the Endpoint Picker is off: InferencePool %s deleted", *key, name)
        except KubeError as error:  # the next reconcile or resync tries again
            log.warning("%s/%s: InferencePool %s not removed: %s", *key, name, error)
            return
        self._absent.add(key)

    def forget(self, key: Key) -> None:
        self._absent.discard(key)
        self._last.pop(key, None)
