"""Where the replicas are: one small interface (:class:`Discovery`), two sources.

- :class:`~modelplex_router.discovery.static.StaticDiscovery` polls a fixed list of replica
  URLs (``modelplex router --replica URL``, local mode);
- :class:`~modelplex_router.discovery.kubernetes.KubernetesDiscovery` watches the replica pods
  of a deployment and reads their loaded-models annotation.
"""

from modelplex_router.discovery.base import Discovery

__all__ = ["Discovery"]
