"""The HTTP request as its client sent it, passed by the router to the replica it forwards it to.

The router sends every request for the handler to the replica's ``POST /v1/invoke``. A
deployment that serves HTTP itself (``serve.ingress``: a FastAPI app) and one with a route
prefix need the method, the path with its query string and the client's headers: the router
adds them as headers (:func:`forwarded_headers`), the replica reads them (:func:`original`).
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping

from modelplex.wire.internal_headers import is_internal_header

METHOD_HEADER = "X-Modelplex-Method"
#: The raw path and query string (percent-encoding kept): ``/detect%2Fv2?url=a``.
PATH_HEADER = "X-Modelplex-Path"

#: Headers of one hop, or that describe the body as it arrived (the router decoded it).
_NOT_FORWARDED = frozenset(name.lower() for name in (
    "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
    "Proxy-Authorization", "Proxy-Authenticate", "Content-Length", "Content-Encoding", "Expect",
    METHOD_HEADER, PATH_HEADER,
))


def forwarded_headers(method: str, raw_path: str, headers: Iterable[tuple[str, str]],
                      skip: tuple[str, ...] = ()) -> dict[str, str]:
    """The headers the router sends the replica: the client's end-to-end ones but those in
    ``skip`` (forwarded already; repeated ones joined, as HTTP allows) and the internal ones (a
    client cannot pass for a component), the method and the raw path."""
    not_forwarded = _not_forwarded(skip)
    out: dict[str, str] = {}
    names: dict[str, str] = {}  # lower-cased -> as first sent
    for name, value in headers:
        key = name.lower()
        if key in not_forwarded or is_internal_header(key):
            continue
        if key in names:
            out[names[key]] += ("; " if key == "cookie" else ", ") + value
        else:
            names[key] = name
            out[name] = value
    out[METHOD_HEADER] = method
    out[PATH_HEADER] = raw_path
    return out


@functools.lru_cache(maxsize=8)
def _not_forwarded(skip: tuple[str, ...]) -> frozenset[str]:
    return _NOT_FORWARDED.union(name.lower() for name in skip)


def original(headers: Mapping[str, str], method: str = "POST") -> tuple[str, str]:
    """The client's method and raw path: from the router's headers, else ``method`` and ``/``
    (a request sent to the replica directly)."""
    return headers.get(METHOD_HEADER, method), headers.get(PATH_HEADER, "/")


#: A deployment's route prefix (``serve.run(route_prefix=...)``), in its replicas' environment:
#: HTTP requests reach the handler only on that path and below it; handles call it whatever it is.
ENV_ROUTE_PREFIX = "MODELPLEX_ROUTE_PREFIX"
#: ``route_prefix=None`` in Ray: the deployment has no HTTP route, only handles call it.
NO_ROUTE = "none"


def check_route_prefix(prefix: str | None) -> str:
    """``prefix`` as Ray Serve accepts it (``/``, ``/api``; None for no HTTP route), or ValueError."""
    if prefix is None:
        return NO_ROUTE
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise ValueError(f"route_prefix must start with '/' (got {prefix!r})")
    if prefix != "/" and prefix.endswith("/"):
        raise ValueError(f"route_prefix must not end with '/' unless it is '/' (got {prefix!r})")
    if any(char in prefix for char in "?#{}") or any(ord(char) < 33 for char in prefix):
        raise ValueError(f"route_prefix must be a plain path (got {prefix!r})")
    return prefix


def under_prefix(path: str, prefix: str) -> bool:
    """Whether ``path`` (no query string) is ``prefix`` or below it: ``/api`` holds ``/api`` and
    ``/api/x``, not ``/apix``."""
    if prefix == NO_ROUTE:
        return False
    if prefix == "/":
        return True
    return path == prefix or path.startswith(prefix + "/")
