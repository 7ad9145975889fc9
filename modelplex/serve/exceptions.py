"""``from modelplex.serve.exceptions import ...`` where Ray code imports ``ray.serve.exceptions``.

Each is also Modelplex's own error for the same answer (:mod:`modelplex.wire.errors`), so code
catching either catches it: a handle's call to a full deployment (503, Ray's
``max_queued_requests``) raises :class:`BackPressureError`; one to a deployment with no ready
replica, :class:`DeploymentUnavailableError`; awaiting a cancelled response,
:class:`RequestCancelledError`; a batched function that answers a batch with a different number
of results, :class:`RayServeException` with Ray's message.
"""

from modelplex.wire.errors import (BackPressureError, DeploymentUnavailableError, RayServeException,
                                   RequestCancelledError)

__all__ = ["BackPressureError", "DeploymentUnavailableError", "RayServeException", "RequestCancelledError"]
