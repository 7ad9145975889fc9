"""What the CRD's schema cannot check, checked with the one spec type (``modelplex.wire.spec``).

The apiserver already refused wrong types, out-of-range numbers, missing required fields and
(with kubectl's strict field validation) unknown fields. What is left, the model source's URI
scheme, the name's length, a name that cannot name a Service (the spec module's rules, which
local mode applies too), is found here and reported by the operator as a ``Degraded``
condition and a Warning Event.
"""

from __future__ import annotations

from typing import Any, Mapping

from modelplex.wire.names import API_GROUP, API_VERSION, KIND
from modelplex.wire.spec import Deployment, SpecError, parse_deployment


def plain(value: Any) -> Any:
    """A deep plain-``dict``/``list`` copy of a (possibly read-only, kopf) mapping."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def validate(body: Mapping[str, Any]) -> Deployment:
    """The deployment a MultiplexedDeployment object describes; :class:`SpecError` if unusable."""
    metadata = body.get("metadata") or {}
    name = metadata.get("name") or ""
    document = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": metadata.get("namespace") or "default"},
        "spec": plain(body.get("spec") or {}),
    }
    return parse_deployment(document)  # the name's rule is the spec's, shared with local mode


def problems_of(error: SpecError) -> str:
    """The problems of a :class:`SpecError` as one line (without the source prefix)."""
    return "; ".join(error.problems)
