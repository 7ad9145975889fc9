"""The router's client list as a live reload may change it: a list that names a client like the
router's own components (``internal``) is refused whole, and the last good one stays.

``modelplex local`` and the operator refuse such a Secret before a router reads it; this is the
router's guard for a Secret edited while it runs. The key is logged, never a token.
"""

from __future__ import annotations

import logging
from typing import Protocol

from modelplex.wire.credentials import RESERVED_CLIENT, same_token

log = logging.getLogger("modelplex.router.auth")


class TokenSource(Protocol):
    """Client names and tokens, read again when they change (:class:`~modelplex.wire.credentials.ClientTokens`)."""

    def current(self) -> object: ...


class KnownClients:
    """The clients of ``source`` whose list holds no reserved name; else the last good list (none
    before the first good one: every bearer token is refused)."""

    def __init__(self, source: TokenSource):
        self.source = source
        self._read: object = None  # the source's list this one was checked from
        self._good: dict[str, str] = {}

    def tokens(self) -> dict[str, str]:
        """The client list in force: the source's, checked each time it changes."""
        current = self.source.current()
        if current is not self._read:
            self._read = current
            listed = current if isinstance(current, dict) else {}
            if RESERVED_CLIENT in listed:
                log.error("the router's client tokens name a client %r, the name of the deployment's own "
                          "components: the new list is refused (%s); rename that key", RESERVED_CLIENT,
                          "the last good one stays" if self._good else "no client is accepted until then")
            else:
                self._good = dict(listed)
        return self._good

    def client_for(self, sent: str) -> str | None:
        """The client whose token ``sent`` is, comparing every token in constant time."""
        found = None
        for client, token in self.tokens().items():
            if same_token(sent, token):
                found = client
        return found
