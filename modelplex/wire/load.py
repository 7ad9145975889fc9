"""The load report: what a router tells the scaler, and the hot-models list a new replica reads.

Both cross a process boundary, so they live here, apart from the scaling policy
(:mod:`modelplex.autoscaling`): the router serves a :class:`LoadReport` at ``GET /v1/load``
(:data:`LOAD_PATH`), the scaler (the operator, or local mode) reads it; the scaler writes the
hottest models with :func:`format_hot_models` to the file named by :data:`ENV_PRELOAD_FILE`,
the replica reads it with :func:`parse_hot_models` at start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

#: The router's endpoint serving its :class:`LoadReport` (JSON).
LOAD_PATH = "/v1/load"
#: The replica reads the models to pre-load (:func:`parse_hot_models`) from the file this names.
ENV_PRELOAD_FILE = "MODELPLEX_PRELOAD_FILE"
#: The key (and file name) of the hot-models list in its ConfigMap.
HOT_MODELS_KEY = "hot-models"
#: The routers count each model's requests over this window (``model_rates`` are per second).
RATE_WINDOW_S = 60.0
#: How long a router holds a request at zero replicas. Ray Serve's bound is far shorter; cold
#: starts here (a pod scheduled, the image's Python started, a model loaded) take up to ~15 s.
DEFAULT_HOLD_AT_ZERO_S = 60.0


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as one router sees it.

    ``ongoing``: the router's requests at the replica now (in its slots, or waiting there for a
    model's load). ``models``: the models it holds (loaded, as the router last learned).
    ``capacity``: how many models it holds at most (0: unknown)."""

    name: str
    ongoing: int = 0
    ready: bool = True
    models: tuple[str, ...] = ()
    capacity: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ongoing": self.ongoing, "ready": self.ready,
                "models": list(self.models), "capacity": self.capacity}


@dataclass(frozen=True)
class LoadReport:
    """What a router (or, merged, all of a deployment's routers) has to say about load.

    ``at``: wall-clock time (Unix seconds) the report was taken, to tell a stale one.
    ``queued``: requests waiting in the router for a replica slot: every replica full, or none
    ready (at zero replicas every request waits here: a scaler seeing ``queued > 0`` at zero
    starts a replica). ``model_rates``: requests per second per model over ``window_s``.
    """

    deployment: str
    at: float
    queued: int = 0
    replicas: tuple[ReplicaLoad, ...] = ()
    model_rates: Mapping[str, float] = field(default_factory=dict)
    window_s: float = RATE_WINDOW_S
    router: str = ""

    @property
    def ongoing(self) -> int:
        """All the requests the scaler counts: at the replicas and queued in the router."""
        return sum(r.ongoing for r in self.replicas) + self.queued

    def replica(self, name: str) -> ReplicaLoad | None:
        """The replica named ``name``, or None."""
        return next((r for r in self.replicas if r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "router": self.router,
            "at": self.at,
            "queued": self.queued,
            "ongoing": self.ongoing,
            "window_s": self.window_s,
            "replicas": [r.to_dict() for r in self.replicas],
            "model_rates": dict(sorted(self.model_rates.items())),
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: Any) -> LoadReport:
        """Raises ValueError naming the field when ``data`` is not a report."""
        if not isinstance(data, dict):
            raise ValueError(f"load report: must be an object (got {type(data).__name__})")
        try:
            replicas = tuple(
                ReplicaLoad(name=str(r["name"]), ongoing=_count(r.get("ongoing", 0), "ongoing"),
                            ready=bool(r.get("ready", True)), models=tuple(str(m) for m in r.get("models", ())),
                            capacity=_count(r.get("capacity", 0), "capacity"))
                for r in data.get("replicas", ())
            )
            rates = {str(model): float(rate) for model, rate in (data.get("model_rates") or {}).items()}
            return cls(deployment=str(data["deployment"]), at=float(data["at"]),
                       queued=_count(data.get("queued", 0), "queued"), replicas=replicas, model_rates=rates,
                       window_s=float(data.get("window_s", RATE_WINDOW_S)), router=str(data.get("router", "")))
        except KeyError as error:
            raise ValueError(f"load report: {error.args[0]}: required") from None
        except (TypeError, AttributeError) as error:
            raise ValueError(f"load report: malformed ({error})") from None

    @classmethod
    def from_json(cls, body: bytes | str) -> LoadReport:
        """Raises ValueError when ``body`` is not a report's JSON."""
        try:
            data = json.loads(body)
        except ValueError as error:
            raise ValueError(f"load report: not JSON ({error})") from None
        return cls.from_dict(data)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"load report: {name}: must be a count >= 0 (got {value!r})")
    return int(value)


def format_hot_models(models: Iterable[str]) -> str:
    """The pre-load file's text: one model id a line, hottest first."""
    return "".join(f"{model}\n" for model in models)


def parse_hot_models(text: str) -> list[str]:
    """The model ids of a pre-load file (blank lines and ``#`` comments skipped, duplicates once)."""
    models = (line.strip() for line in text.splitlines())
    return list(dict.fromkeys(m for m in models if m and not m.startswith("#")))
