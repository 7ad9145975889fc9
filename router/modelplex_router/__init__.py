"""The Modelplex router: discovery of replicas, cache-aware routing, a streaming proxy, metrics.

Entry point: :func:`modelplex_router.server.run_router` (``modelplex router``). The router
never imports the replica runtime or torch (an import-linter contract in pyproject.toml).
"""
