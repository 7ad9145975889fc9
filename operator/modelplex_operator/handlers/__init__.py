"""What the kopf handlers in :mod:`modelplex_operator.main` hand off to.

- :mod:`.context`: the operator's shared state (settings, client, latest indexes, outcomes);
- :mod:`.lifecycle`: startup settings, the :class:`~.lifecycle.Operator` that wires the parts
  (kept in kopf's ``memo``), cleanup, the liveness probe;
- :mod:`.reconcile`: validate the spec, apply the desired objects, report the outcome;
- :mod:`.observe`: the indexes of resources, replica pods and owned Deployments, and the
  events that poke the status keeper;
- :mod:`.keeper`: the status keeper (debounced status writes, drift repair, resync);
- :mod:`.autoscale`: the autoscaler (routers' load reports in, replica counts, pod deletion
  costs and the hot-models list out).
"""
