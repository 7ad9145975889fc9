"""Redaction of URLs before they reach a message, a status, an Event, a metric or a log.

A model source's URL may carry credentials in its userinfo (``https://user:password@host``)
or its query (a signed URL's ``?sig=...``, ``?token=...``). The source itself uses the URL as
it stands; everything shown to a person or a client goes through :func:`redact_url` (one URL)
or :func:`redact_text` (a message that may hold URLs), so a 404 message, ``GET /v1/models``'s
``failures``, a ``ModelLoadFailed`` Event and a log line never carry them.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

REDACTED = "REDACTED"
#: A URL inside free text: a scheme, ``//`` and everything up to whitespace or a quote, less
#: the punctuation that ends a sentence or a clause (``...x.pt: HTTP 404``).
_URL_IN_TEXT = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>]+?(?=[.,:;)]*(?:[\s'"<>]|$))""")
_QUERY_VALUE = re.compile(r"=[^&;#]*")


def redact_url(url: str) -> str:
    """``url`` with its userinfo and every query value replaced by ``REDACTED`` (the query's
    names stay, so ``?sig=REDACTED&expires=REDACTED`` still says what kind of URL it was)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL at all (an unbalanced IPv6 bracket): show nothing of it
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = _QUERY_VALUE.sub(f"={REDACTED}", parts.query)
    if query and "=" not in parts.query:
        query = REDACTED  # a bare ``?token`` is a value too
    rebuilt = f"{parts.scheme}://{netloc}" if parts.scheme and (netloc or url.startswith(f"{parts.scheme}://")) \
        else (f"{parts.scheme}:" if parts.scheme else "")
    rebuilt += parts.path
    if parts.query or "?" in url:
        rebuilt += f"?{query}"
    if parts.fragment:
        rebuilt += f"#{parts.fragment}"
    return rebuilt


def redact_text(text: str) -> str:
    """``text`` with every ``scheme://...`` URL in it passed through :func:`redact_url`."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)
