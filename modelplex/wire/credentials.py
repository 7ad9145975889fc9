"""Credentials that cross a process boundary: the namespace's internal token and the router's
client tokens.

The internal credential is one random token per namespace (per run in local mode): routers send
it to replicas, handles send it to routers, and replicas refuse their internal API without it.
It reaches a process as a file (``MODELPLEX_INTERNAL_TOKEN_FILE``: a mounted Secret in pods, a
file of the run in local mode) and is read again whenever the file changes, so a rotated value
is picked up without a restart.

Client tokens (``spec.router.auth.secretRef``) are a folder with one file per client name whose
content is that client's bearer token: the layout Kubernetes gives a Secret mounted as a volume,
and the one local mode writes for a ``kind: Secret`` document.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

#: Router → replica and handle → router: the internal credential.
INTERNAL_TOKEN_HEADER = "X-Modelplex-Internal-Token"
#: A file holding the internal credential (pods: the mounted Secret; local mode: the run's).
ENV_INTERNAL_TOKEN_FILE = "MODELPLEX_INTERNAL_TOKEN_FILE"
#: The router's client tokens: a folder, one file per client name.
ENV_CLIENT_TOKENS_DIR = "MODELPLEX_CLIENT_TOKENS_DIR"
#: The key of the internal Secret that holds the token.
INTERNAL_SECRET_KEY = "token"
#: The Secret the operator creates in every namespace it serves.
INTERNAL_SECRET_NAME = "modelplex-internal"
#: Where pods mount it.
INTERNAL_TOKEN_MOUNT = "/var/run/modelplex/internal"
#: Where router pods mount the client tokens' Secret.
CLIENT_TOKENS_MOUNT = "/var/run/modelplex/clients"
#: A browser's EventSource cannot send headers: it passes its bearer token in this parameter.
ACCESS_TOKEN_PARAM = "access_token"


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def same_token(sent: str, expected: str) -> bool:
    """Compare in constant time, so the answer's timing tells nothing of the token."""
    return hmac.compare_digest(sent.encode(), expected.encode())


@dataclass
class _Read:
    stamp: tuple[int, int, int] | None
    value: object


class _Watched:
    """A file or folder read again only when it changes (a Secret volume swaps a ``..data`` link
    on update, which changes the folder's stamp; a plain file changes its own)."""

    def __init__(self, path: Path):
        self.path = path
        self._read = _Read(None, None)

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            # A Secret volume's files are links into a ``..data`` folder that the kubelet swaps.
            data = self.path / "..data"
            info = (data if data.exists() else self.path).stat()
            return info.st_ino, info.st_mtime_ns, info.st_size
        except OSError:
            return None

    def current(self) -> object:
        stamp = self._stamp()
        if stamp is None or stamp != self._read.stamp:
            self._read = _Read(stamp, self._load() if stamp is not None else None)
        return self._read.value

    def _load(self) -> object:
        raise NotImplementedError


class TokenFile(_Watched):
    """The internal credential from a file, re-read when the file changes."""

    def _load(self) -> str | None:
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def token(self) -> str | None:
        """The token, or None while the file is missing or empty."""
        value = self.current()
        return value if isinstance(value, str) else None

    def accepts(self, sent: str | None) -> bool:
        """Whether ``sent`` is the current token (never when there is none)."""
        expected = self.token()
        return sent is not None and expected is not None and same_token(sent, expected)


class ClientTokens(_Watched):
    """The router's client names and tokens: a folder, one file per client, re-read on change."""

    def _load(self) -> dict[str, str]:
        tokens: dict[str, str] = {}
        try:
            entries = sorted(self.path.iterdir())
        except OSError:
            return tokens
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file():
                continue
            token = entry.read_text().strip()
            if token:
                tokens[entry.name] = token
        return tokens

    def client_for(self, sent: str) -> str | None:
        """The client whose token ``sent`` is, comparing every token in constant time."""
        found = None
        tokens = self.current()
        for client, token in (tokens.items() if isinstance(tokens, dict) else ()):
            if same_token(sent, token):
                found = client
        return found


#: The credential ``serve.run`` made for its script's handles (not put in ``os.environ``, so the
#: processes the script starts by other means are not handed it).
_in_use: TokenFile | None = None


def use_internal_token(path: Path) -> None:
    """Make ``path`` this process's internal credential where the environment names none."""
    global _in_use
    _in_use = TokenFile(path)


def internal_token_file() -> TokenFile | None:
    """This process's internal credential: the file ``MODELPLEX_INTERNAL_TOKEN_FILE`` names, else
    the one :func:`use_internal_token` set, else None."""
    path = os.environ.get(ENV_INTERNAL_TOKEN_FILE)
    return TokenFile(Path(path)) if path else _in_use


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path`` readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(token)
    return path
