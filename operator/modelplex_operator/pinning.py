"""Scale-downs that keep declared copies (``spec.models`` ``minCopies``), as pure functions.

Before a scale-down removes replica pods, the operator pins each declared model on the pods
that stay, where the routers' placement (:func:`modelplex.wire.pins.place_pins`, the same
function over the same pods) will put it, and waits for those loads; only then does it lower
the count. So a pod that holds the last copy of a pinned model leaves only after another holds
one, and the routers renew the very leases the operator took.

The ReplicaSet picks which pods go: pods not ready first, then the lowest
``controller.kubernetes.io/pod-deletion-cost``. The autoscaler writes those costs already
(:mod:`modelplex_operator.scaling`); for a ``spec.replicas`` scale-down the operator marks the
pods it chose (:func:`leaving_for_scale_down`) with :data:`LEAVING_COST`, below any cost the
autoscaler writes (those are request rates, never negative).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from modelplex.wire.pins import place_pins
from modelplex_operator.status import PodView

#: The pod-deletion-cost of a pod a ``spec.replicas`` scale-down removes.
LEAVING_COST = -1_000_000


def prewarm_plan(pinned: Mapping[str, int], staying: Mapping[str, int]) -> dict[str, tuple[str, ...]]:
    """``{pod: pinned ids}`` to pin (and load) on the ``staying`` pods (name -> model capacity,
    0 unknown) before the others go: the placement the routers will compute over them."""
    return {pod: models for pod, models in place_pins(pinned, staying).replicas.items() if models}


def leaving_for_scale_down(pods: Iterable[PodView], count: int) -> list[str]:
    """The ``count`` pods a ``spec.replicas`` scale-down should remove: those not ready first (the
    ReplicaSet takes them first whatever their cost), then the last by name."""
    ranked = sorted(pods, key=lambda pod: (pod.ready, _reversed(pod.name)))
    return [pod.name for pod in ranked[:max(count, 0)]]


def _reversed(name: str) -> tuple[int, ...]:
    return tuple(-ord(char) for char in name) + (0,)
