"""A local Kubernetes control plane for trying Modelplex and for its end-to-end tests.

``modelplex cluster up|down|status|build`` (see :func:`main`); in Python,
:class:`ControlPlane` and :func:`build_binaries` (imported lazily, so that
``import modelplex_cluster`` stays cheap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from modelplex_cluster.controlplane import ControlPlane, ControlPlaneError, build_binaries

__all__ = ["main", "ControlPlane", "ControlPlaneError", "build_binaries"]


def main(argv: list[str]) -> int:
    """``modelplex cluster up|down|status|build``; returns the exit code."""
    from modelplex_cluster.command import main as _main

    return _main(argv)


def __getattr__(name: str):
    if name in ("ControlPlane", "ControlPlaneError", "build_binaries"):
        from modelplex_cluster import controlplane

        return getattr(controlplane, name)
    raise AttributeError(name)
