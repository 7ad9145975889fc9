"""Which ``X-Modelplex-*`` headers only the deployment's own components send.

Routers, handles and replicas tell each other things in ``X-Modelplex-*`` headers: the internal
credential, the client's method and raw path, the protocol of a forwarded body, the version asked
for, the loaded-models summary, the replica that answered. A client that sends one of them is
either confused or trying to pass for a component, so the router drops them on the way in; and
since user code must never see what components say to each other (the credential least of all),
the replica removes every one of them before a handler, an ingress app or its ASGI scope sees the
request (as Envoy's ``internal_only_headers`` does at the edge).

One rule instead of a list, so that a header added later is internal without anyone remembering
to list it: every ``X-Modelplex-*`` header is internal except those clients are told to send
(:data:`CLIENT_HEADERS`).
"""

from __future__ import annotations

INTERNAL_PREFIX = "x-modelplex-"
#: A request's cold-load policy (``onCold``): README, "Sharing between models".
ON_COLD_HEADER = "x-modelplex-on-cold"
#: The ``X-Modelplex-*`` headers clients send (lower case): they pass the router and reach user code.
CLIENT_HEADERS = frozenset({ON_COLD_HEADER})


def is_internal_header(name: str) -> bool:
    """Whether only the deployment's components may send the header ``name`` (any case)."""
    key = name.lower()
    return key.startswith(INTERNAL_PREFIX) and key not in CLIENT_HEADERS

