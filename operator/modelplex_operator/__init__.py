"""The Modelplex operator: reconciles MultiplexedDeployments into Kubernetes objects.

- :mod:`modelplex_operator.main` is the switchboard: every kopf decorator, each handing off
  to :mod:`modelplex_operator.handlers`; ``run_operator()`` starts kopf.
- :mod:`modelplex_operator.builders` builds the desired objects (pure functions).
- :mod:`modelplex_operator.status` computes the status and its conditions (pure).
- :mod:`modelplex_operator.validation` checks what the CRD schema cannot (pure).
- :mod:`modelplex_operator.kube` is the thin Kubernetes client (server-side apply, status).
"""

__all__ = ["FIELD_MANAGER", "MANAGED_BY"]

#: The server-side-apply field manager, and the ``app.kubernetes.io/managed-by`` label value.
FIELD_MANAGER = "modelplex-operator"
MANAGED_BY = "modelplex-operator"
