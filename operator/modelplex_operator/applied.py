"""Whether an object on the server already is what the operator would apply (pure; no API calls).

An apply the server would answer with the same object is a write for nothing, and a steady-state
reconcile (a resume, the periodic resync) would make one per owned object. :func:`in_step` says
when it can be skipped: every field the operator sets has the desired value on the server, and
the object was last applied from the same desired object (:data:`ANNOTATION_APPLIED`, a hash of
it, which the operator writes with each apply). The hash is what catches a field the operator
stopped setting: comparing the fields it sets cannot, and the server-side apply that follows a
changed hash removes it.

An object made by a create (``POST``) is tracked by the server under the operator's field manager
with the operation ``Update``; a server-side apply tracks its fields under ``Apply``, and only
fields owned by nobody else are removed when an apply stops setting them. :func:`adopt_created`
is the JSON patch that moves the create's fields to the operator's ``Apply`` entry (as
``kubectl``'s client-side to server-side upgrade does), so the next apply can remove them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

#: The hash of the desired object an owned object was last applied from.
ANNOTATION_APPLIED = "modelplex.io/applied-hash"


def applied_hash(obj: dict[str, Any]) -> str:
    """A stable hash of a desired object (its own :data:`ANNOTATION_APPLIED` left out)."""
    meta = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != ANNOTATION_APPLIED}
    meta["annotations"] = annotations
    canonical = json.dumps({**obj, "metadata": meta}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_applied_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` carrying its :func:`applied_hash` (a copy; ``obj`` is left as it is)."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_APPLIED: applied_hash(obj)}
    return {**obj, "metadata": meta}


#: Maps of resource quantities, which the server writes in its own form (``1`` -> ``"1"``,
#: ``0.5`` -> ``"500m"``): their values compare as quantities.
QUANTITY_MAPS = frozenset({"limits", "requests"})


def same_quantity(actual: Any, desired: Any) -> bool:
    """Whether two resource quantities are the same amount (unparseable ones: equal as written)."""
    from kubernetes.utils import parse_quantity

    try:
        return bool(parse_quantity(actual) == parse_quantity(desired))
    except ValueError:
        return bool(actual == desired)


def contains(actual: Any, desired: Any, quantities: bool = False) -> bool:
    """Whether every field of ``desired`` has its value in ``actual`` (the server adds defaults
    and fields of its own: those are not compared). Lists compare item by item, same length;
    ``quantities``: ``desired`` is a map of resource quantities (:data:`QUANTITY_MAPS`)."""
    if isinstance(desired, dict):
        if not isinstance(actual, dict):
            return False
        for key, value in desired.items():
            if key not in actual:
                return False
            if quantities and actual[key] != value:
                if not same_quantity(actual[key], value):
                    return False
            elif not contains(actual[key], value, key in QUANTITY_MAPS):
                return False
        return True
    if isinstance(desired, list):
        return isinstance(actual, list) and len(actual) == len(desired) and all(
            contains(a, d) for a, d in zip(actual, desired))
    return bool(actual == desired)


def in_step(existing: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether applying ``desired`` (as :func:`with_applied_hash` makes it) would change nothing
    the operator owns on ``existing``."""
    annotations = (existing.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ANNOTATION_APPLIED) != applied_hash(desired):
        return False
    return contains(existing, with_applied_hash(desired))


def adopt_created(existing: dict[str, Any], manager: str) -> list[dict[str, Any]] | None:
    """The JSON patch that turns the ``Update`` entry a create left under ``manager`` into its
    ``Apply`` entry (or drops it where an ``Apply`` entry exists already); None when there is
    none. Each change is guarded by ``test`` operations, so a patch computed from an outdated
    read fails (422) instead of editing another entry."""
    entries = (existing.get("metadata") or {}).get("managedFields") or []
    ours = [(index, entry) for index, entry in enumerate(entries)
            if entry.get("manager") == manager and not entry.get("subresource")]
    updates = [index for index, entry in ours if entry.get("operation") == "Update"]
    if not updates:
        return None
    index = updates[0]
    path = f"/metadata/managedFields/{index}"
    guard = [{"op": "test", "path": f"{path}/manager", "value": manager},
             {"op": "test", "path": f"{path}/operation", "value": "Update"}]
    if any(entry.get("operation") == "Apply" for _, entry in ours):
        return [*guard, {"op": "remove", "path": path}]
    return [*guard, {"op": "replace", "path": f"{path}/operation", "value": "Apply"}]
