"""Local mode's ready file: where each deployment of a ``modelplex local`` run answers.

``modelplex local`` prints a line per deployment for people (``NAME is ready at http://H:P  gRPC
H:G ...``); programs (``serve.run``, the tests, the benchmarks) read this file instead, so the
printed lines may change wording without breaking them. The run writes it once every router has
its replicas ready, atomically (a reader never sees half a file), to the path given with
``modelplex local --ready-file PATH`` or ``$MODELPLEX_READY_FILE``, and removes it when it stops:
the file exists while the run serves.

The shape is JSON, ``{"version": 1, "deployments": [{"name", "url", "grpc", "control", "picker",
"gateway"}]}``.
Fields are only ever added; a reader ignores what it does not know, and a field a writer left
out reads as ``None``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The environment variable naming the ready file (the ``--ready-file`` option wins over it).
ENV_READY_FILE = "MODELPLEX_READY_FILE"
#: ``modelplex local``'s option naming the ready file.
READY_FILE_OPTION = "--ready-file"
#: The shape's version: a reader refuses a file of a newer, incompatible shape.
VERSION = 1


@dataclass(frozen=True)
class ReadyDeployment:
    """One deployment of a run: its name, its router's base URL and what gRPC clients dial."""

    name: str
    #: The router's HTTP base URL (``http://host:port``), what ``MODELPLEX_ROUTER_<NAME>`` holds.
    url: str
    #: The router's Open Inference Protocol over gRPC, ``host:port`` (IPv6 hosts bracketed).
    grpc: str
    #: The router's control port, ``host:port``: ``/healthz``, ``/readyz`` and ``/metrics``.
    control: str | None = None
    #: The Endpoint Picker's address (``host:port``: ext_proc), with ``spec.router.endpointPicker.enabled``.
    picker: str | None = None
    #: The Envoy in front of the picker (``http://host:port``), with ``spec.router.endpointPicker.envoy``.
    gateway: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "grpc": self.grpc, "control": self.control, "picker": self.picker,
                "gateway": self.gateway}

    @classmethod
    def from_dict(cls, raw: Any) -> ReadyDeployment:
        if not isinstance(raw, dict):
            raise ValueError(f"deployments[]: expected an object (got {raw!r})")
        values: dict[str, str | None] = {}
        for key in ("name", "url", "grpc", "control", "picker", "gateway"):
            value = raw.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"deployments[].{key}: expected a string (got {value!r})")
            values[key] = value
        name, url, grpc = values["name"], values["url"], values["grpc"]
        if not name or not url or grpc is None:
            raise ValueError(f"deployments[]: name, url and grpc are required (got {raw!r})")
        return cls(name=name, url=url, grpc=grpc, control=values["control"], picker=values["picker"],
                   gateway=values["gateway"])


@dataclass(frozen=True)
class ReadyFile:
    """Every deployment a run serves, in the order of its manifests."""

    deployments: tuple[ReadyDeployment, ...] = ()

    @property
    def urls(self) -> dict[str, str]:
        """Each deployment's router URL, by deployment name."""
        return {d.name: d.url for d in self.deployments}

    @property
    def grpc(self) -> dict[str, str]:
        """Each deployment's gRPC address, by deployment name."""
        return {d.name: d.grpc for d in self.deployments}

    @property
    def control(self) -> dict[str, str]:
        """Each deployment's control address (probes, metrics), by deployment name, where it has one."""
        return {d.name: d.control for d in self.deployments if d.control}

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "deployments": [d.to_dict() for d in self.deployments]}, indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> ReadyFile:
        """Parse a ready file's text; :class:`ValueError` for anything but its shape."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"ready file: expected an object (got {raw!r})")
        version = raw.get("version", VERSION)
        if not isinstance(version, int) or version > VERSION:
            raise ValueError(f"ready file: version {version!r} is newer than this reader's ({VERSION})")
        deployments = raw.get("deployments") or []
        if not isinstance(deployments, list):
            raise ValueError("ready file: deployments: expected a list")
        return cls(tuple(ReadyDeployment.from_dict(item) for item in deployments))


def write_ready_file(path: str | Path, ready: ReadyFile) -> None:
    """Write ``ready`` to ``path`` at once: a temporary file beside it, renamed over it."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(ready.to_json())
    os.replace(temporary, path)


def read_ready_file(path: str | Path) -> ReadyFile | None:
    """The ready file at ``path``; ``None`` while there is none (the run is not ready yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    return ReadyFile.from_json(text)
