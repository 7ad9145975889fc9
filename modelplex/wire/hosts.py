"""How a component names a peer in a URL: the one rule for IPv4, IPv6 and DNS names.

A pod IP, a bind address or a host name becomes the host part of ``http://HOST:PORT``; an IPv6
literal needs brackets there (``http://[fd00::1]:9000``), which is what a plain f-string forgets.
The operator, the router and local mode all build replica and router URLs with it.
"""

from __future__ import annotations

#: Addresses a server binds to that a client cannot dial; a client on the same host dials these.
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def url_host(host: str) -> str:
    """``host`` as the host part of a URL: an IPv6 literal in brackets, anything else as it is."""
    host = host.strip("[]")
    return f"[{host}]" if ":" in host else host


def dial_host(bind: str) -> str:
    """What a client on the same machine dials to reach a server bound to ``bind`` (a wildcard
    bind is reached on loopback), as the host part of a URL."""
    return url_host(_WILDCARDS.get(bind.strip("[]"), bind))


def base_url(host: str, port: int, scheme: str = "http") -> str:
    """``scheme://HOST:PORT`` for a host, pod IP or bind address (a wildcard dials loopback)."""
    return f"{scheme}://{dial_host(host)}:{port}"
