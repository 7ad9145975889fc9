"""What of a client's request the router passes on to the handler (its route prefix, its
``serve.ingress`` app), and what it keeps.

Passed as sent: the method, the raw path and query string, and the client's end-to-end headers
(``Cookie``, an ``Authorization`` the router did not read), so an app behind a gateway that
authenticates keeps working. Kept back:

- the model-id headers: the replica gets the one id the router decided on (its own header);
- every internal header (:mod:`modelplex.wire.internal_headers`): a client cannot pass for a
  component (:func:`modelplex.wire.forwarded.forwarded_headers` drops them);
- with router auth on, the credential the router itself consumed: a bearer ``Authorization``
  and the ``access_token`` query parameter, unless ``spec.router.forwardCredentials`` is on.

Pure functions over plain values.
"""

from __future__ import annotations

from typing import Iterable
from urllib.parse import unquote_plus

from modelplex.wire.credentials import ACCESS_TOKEN_PARAM
from modelplex.wire.forwarded import forwarded_headers
from modelplex.wire.names import DASHED_MODEL_ID_HEADER, MODEL_ID_HEADER

#: The router sends its own model id; the client's never reaches the replica.
MODEL_ID_HEADERS = (MODEL_ID_HEADER, DASHED_MODEL_ID_HEADER)


def relayed_headers(method: str, raw_path: str, headers: Iterable[tuple[str, str]], skip: tuple[str, ...], *,
                    keep_credentials: bool) -> dict[str, str]:
    """The headers the replica gets for the client's request (the method and raw path among
    them); ``skip``: headers the proxy forwards itself; ``keep_credentials``: false where the
    router consumed the bearer token (auth on, ``forwardCredentials`` off)."""
    headers = list(headers)
    dropped = skip + MODEL_ID_HEADERS
    if not keep_credentials:
        if any(name.lower() == "authorization" and is_bearer(value) for name, value in headers):
            dropped += ("Authorization",)
        raw_path = without_param(raw_path, ACCESS_TOKEN_PARAM)
    return forwarded_headers(method, raw_path, headers, dropped)


def is_bearer(authorization: str) -> bool:
    """Whether an ``Authorization`` value is a bearer token (the kind the router reads)."""
    return authorization.partition(" ")[0].lower() == "bearer"


def without_param(raw_path: str, name: str) -> str:
    """``raw_path`` with every ``name`` parameter of its query string removed; the rest of it
    exactly as sent (its percent-encoding and order kept)."""
    path, mark, query = raw_path.partition("?")
    if not mark:
        return raw_path
    kept = [part for part in query.split("&") if unquote_plus(part.partition("=")[0]) != name]
    return f"{path}?{'&'.join(kept)}" if kept else path
