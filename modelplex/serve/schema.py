"""``from modelplex.serve.schema import LoggingConfig`` where Ray code imports ``ray.serve.schema``."""

from modelplex.serve.config import LoggingConfig

__all__ = ["LoggingConfig"]
