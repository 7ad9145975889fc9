"""Ray Serve's configuration objects (``ray.serve.config``), with Ray's fields and defaults.

``AutoscalingConfig`` is accepted where Ray takes one (``autoscaling_config=``) and becomes the
same dict Ray's keys give (:mod:`modelplex.serve.deployment`); ``HTTPOptions`` is what
``serve.start(http_options=...)`` takes. A field Modelplex has no equivalent for is refused by
name when set to anything but Ray's default, never ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

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
        if options is None or isinstance(options, HTTPOptions):
            return options or cls()
        if not isinstance(options, Mapping):
            raise TypeError(f"http_options must be an HTTPOptions or a dict (got {type(options).__name__})")
        unknown = sorted(set(options) - {field.name for field in fields(cls)})
        if unknown:
            raise TypeError(f"http_options: unknown field(s) {', '.join(unknown)}")
        return cls(**options)


def refuse_non_default(config: Any, honoured: set[str], what: str) -> None:
    """ValueError naming every field of the dataclass ``config`` set to other than its default,
    outside ``honoured`` (Modelplex has no equivalent for them)."""
    defaults = {field.name: field.default for field in fields(config)}
    changed = sorted(name for name, default in defaults.items()
                     if name not in honoured and getattr(config, name) != default)
    if changed:
        raise ValueError(f"{what}: {', '.join(changed)} {'is' if len(changed) == 1 else 'are'} not supported by "
                         f"Modelplex (it takes {', '.join(sorted(honoured))})")

