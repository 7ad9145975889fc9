"""Ray Serve's configuration objects (``ray.serve.config``), with Ray's fields and defaults.

``AutoscalingConfig`` is accepted where Ray takes one (``autoscaling_config=``) and becomes the
same dict Ray's keys give (:mod:`modelplex.serve.deployment`); ``HTTPOptions`` is what
``serve.start(http_options=...)`` takes. A field Modelplex has no equivalent for is refused by
name when set to anything but Ray's default, never ignored. ``LoggingConfig`` is what
``logging_config=`` takes (also as ``modelplex.serve.schema.LoggingConfig``, where Ray has it).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, TypeVar

T = TypeVar("T")

#: Ray's ``DEFAULT_HTTP_PORT`` and host: the shared HTTP port of ``serve.run``'s applications.
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000


@dataclass
class AutoscalingConfig:
    """Ray's ``AutoscalingConfig``: its fields and defaults. ``target_ongoing_requests`` and the
    delays and bounds become ``spec.autoscaling``; Ray's tuning of its own control loop
    (smoothing and scaling factors, ``metrics_interval_s``, ``aggregation_function``) has no
    effect (Modelplex decides every second)."""

    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    metrics_interval_s: float = 10.0
    smoothing_factor: float = 1.0
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    downscale_to_zero_delay_s: float | None = None
    aggregation_function: str = "mean"

    def to_dict(self) -> dict[str, Any]:
        """The set fields by Ray's keys, as a dict ``autoscaling_config`` takes (None left out)."""
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass
class HTTPOptions:
    """Ray's ``HTTPOptions``: where ``serve.run``'s applications answer HTTP. ``host`` and ``port``
    apply; Ray's proxy settings that have no equivalent here (a ``root_path``, per-request and
    keep-alive timeouts, ASGI middlewares, proxy placement) are refused unless left at Ray's
    default: the routers' own timeouts are ``spec.router``'s."""

    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    root_path: str = ""
    request_timeout_s: float | None = None
    keep_alive_timeout_s: float = 5.0
    middlewares: list[Any] | None = None
    location: str | None = None

    def __post_init__(self) -> None:
        refuse_non_default(self, {"host", "port"}, "HTTPOptions")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ValueError(f"HTTPOptions: port must be an integer in 1..65535 (got {self.port!r})")

    @classmethod
    def of(cls, options: HTTPOptions | Mapping[str, Any] | None) -> HTTPOptions:
        """``options`` as given to ``serve.start``: an ``HTTPOptions``, a dict of its fields, or None."""
        return cls() if options is None else of_fields(cls, options, "http_options")


#: ``LoggingConfig.log_level``'s names: ``spec.logging.level``.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Ray's logging settings with no equivalent here, and why.
_LOGGING_REFUSED = {
    "logs_dir": "the router and the replicas log to stderr, where kubectl logs and modelplex local read them",
    "additional_log_standard_attrs": "encoding JSON writes a fixed set of a record's attributes",
}


@dataclass
class LoggingConfig:
    """Ray's ``LoggingConfig`` (``ray.serve.schema.LoggingConfig``), its fields and defaults:
    ``log_level`` and ``encoding`` become ``spec.logging`` (the router's and the replicas' own
    logs), ``enable_access_log`` ``spec.router.accessLog``. ``logs_dir`` and
    ``additional_log_standard_attrs`` are refused by name, with the reason, unless left unset."""

    encoding: str | None = None
    log_level: int | str = "INFO"
    logs_dir: str | None = None
    enable_access_log: bool = True
    additional_log_standard_attrs: list[str] | None = None

    def __post_init__(self) -> None:
        for name, reason in _LOGGING_REFUSED.items():
            if getattr(self, name):
                raise ValueError(f"LoggingConfig: {name} is not supported by Modelplex: {reason}")
        level = logging.getLevelName(self.log_level) if isinstance(self.log_level, int) else self.log_level
        if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
            raise ValueError(f"LoggingConfig: log_level must be one of {', '.join(LOG_LEVELS)} (got {self.log_level!r})")
        self.log_level = level.upper()
        encoding = self.encoding or "TEXT"  # Ray's None: its default, TEXT
        if not isinstance(encoding, str) or encoding.upper() not in ("TEXT", "JSON"):
            raise ValueError(f"LoggingConfig: encoding must be TEXT or JSON (got {self.encoding!r})")
        self.encoding = encoding.upper()
        if not isinstance(self.enable_access_log, bool):
            raise ValueError(f"LoggingConfig: enable_access_log must be True or False (got {self.enable_access_log!r})")

    @classmethod
    def of(cls, config: LoggingConfig | Mapping[str, Any]) -> LoggingConfig:
        """``logging_config`` as Ray takes it: a ``LoggingConfig`` or a dict of its fields."""
        return of_fields(cls, config, "logging_config")

    def spec(self) -> dict[str, Any]:
        """The manifest's fields: ``{"logging": {...}, "router": {"accessLog": ...}}``."""
        return {"logging": {"level": self.log_level, "encoding": self.encoding},
                "router": {"accessLog": self.enable_access_log}}


def of_fields(cls: type[T], value: T | Mapping[str, Any], what: str) -> T:
    """``value`` as Ray takes a config object: an instance of the dataclass ``cls``, or a dict of
    its fields (an unknown one refused by name)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a {cls.__name__} or a dict (got {type(value).__name__})")
    unknown = sorted(set(value) - {field.name for field in fields(cls)})  # type: ignore[arg-type]  # T is one of the dataclasses above
    if unknown:
        raise TypeError(f"{what}: unknown field(s) {', '.join(unknown)}")
    return cls(**value)


def refuse_non_default(config: Any, honoured: set[str], what: str) -> None:
    """ValueError naming every field of the dataclass ``config`` set to other than its default,
    outside ``honoured`` (Modelplex has no equivalent for them)."""
    defaults = {field.name: field.default for field in fields(config)}
    changed = sorted(name for name, default in defaults.items()
                     if name not in honoured and getattr(config, name) != default)
    if changed:
        raise ValueError(f"{what}: {', '.join(changed)} {'is' if len(changed) == 1 else 'are'} not supported by "
                         f"Modelplex (it takes {', '.join(sorted(honoured))})")

