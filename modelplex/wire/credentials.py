"""Credentials that cross a process boundary: a deployment's internal token, its callers', and
the router's client tokens.

The internal credential is one random token per deployment: its routers send it to its replicas,
the handles in its replicas send it to the routers they call, and its replicas refuse their
internal API without it. It reaches a process as a file (``MODELPLEX_INTERNAL_TOKEN_FILE``: the
deployment's mounted Secret ``N-internal`` in pods, a file of the run in local mode) and is read
again whenever the file changes, so a rotated value is picked up without a restart.

A router accepts another deployment's credential only from a caller its deployment lists
(``spec.router.callers``; the deployments of one application list each other): a folder
(``MODELPLEX_CALLER_TOKENS_DIR``) with one file per calling deployment, and that caller is then
a named client of the router (its globs and quota apply). Upgrading from the namespace-wide
credential of earlier versions, a deployment's Secret holds the namespace's token beside its own
until every pod of the deployment has rolled (``MODELPLEX_LEGACY_TOKEN_FILE``): see
:class:`DeploymentCredential`.

Client tokens (``spec.router.auth.secretRef``) are a folder with one file per client name whose
content is that client's bearer token: the layout Kubernetes gives a Secret mounted as a volume,
and the one local mode writes for a ``kind: Secret`` document.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: Router → replica and handle → router: the internal credential.
INTERNAL_TOKEN_HEADER = "X-Modelplex-Internal-Token"
#: A file holding the internal credential (pods: the mounted Secret; local mode: the run's).
ENV_INTERNAL_TOKEN_FILE = "MODELPLEX_INTERNAL_TOKEN_FILE"
#: The router's client tokens: a folder, one file per client name.
ENV_CLIENT_TOKENS_DIR = "MODELPLEX_CLIENT_TOKENS_DIR"
#: Upgrading from a namespace credential: a file holding the namespace's token (absent after).
ENV_LEGACY_TOKEN_FILE = "MODELPLEX_LEGACY_TOKEN_FILE"
#: A router's callers: a folder, one file per calling deployment holding its credential.
ENV_CALLER_TOKENS_DIR = "MODELPLEX_CALLER_TOKENS_DIR"
#: Local mode: the run's own credential (its scripts' handles), which its routers accept too.
ENV_RUN_TOKEN_FILE = "MODELPLEX_RUN_TOKEN_FILE"
#: The key of a deployment's internal Secret that holds its token.
INTERNAL_SECRET_KEY = "token"
#: The key that holds the namespace's token while a deployment upgrades from it.
LEGACY_SECRET_KEY = "namespace-token"
#: The namespace-wide Secret of earlier versions (read once per deployment, on its upgrade).
INTERNAL_SECRET_NAME = "modelplex-internal"
#: Where pods mount their deployment's Secret.
INTERNAL_TOKEN_MOUNT = "/var/run/modelplex/internal"
#: Where router pods mount the client tokens' Secret.
CLIENT_TOKENS_MOUNT = "/var/run/modelplex/clients"
#: Where router pods mount their callers' credentials.
CALLER_TOKENS_MOUNT = "/var/run/modelplex/callers"
#: A client name that no client and no caller may have: the router's name for its own components.
RESERVED_CLIENT = "internal"
#: After the namespace's token leaves a deployment's Secret, its pods go on accepting it this
#: long: the kubelet updates each pod's mounted files on its own sync (about a minute apart), so
#: a router may send the old token for a while after a replica saw it go.
LEGACY_GRACE_S = 180.0


def internal_secret_name(deployment: str) -> str:
    """The Secret that holds a deployment's internal credential: ``N-internal``."""
    return f"{deployment}-internal"
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


#: How long a credential read is trusted before its file's stamp is looked at again. Every
#: request checks a credential, and a ``stat()`` per request cost the router several percent of
#: its CPU; a rotation reaches a pod's files on the kubelet's sync (about a minute) anyway.
RECHECK_S = 1.0


class _Watched:
    """A file or folder read again only when it changes (a Secret volume swaps a ``..data`` link
    on update, which changes the folder's stamp; a plain file changes its own), looked at no
    more than once per ``recheck_s``."""

    def __init__(self, path: Path, *, recheck_s: float = RECHECK_S, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.recheck_s = recheck_s
        self.clock = clock
        self._read = _Read(None, None)
        self._checked_at: float | None = None

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            # A Secret volume's files are links into a ``..data`` folder that the kubelet swaps.
            data = self.path / "..data"
            info = (data if data.exists() else self.path).stat()
            return info.st_ino, info.st_mtime_ns, info.st_size
        except OSError:
            return None

    def current(self) -> object:
        now = self.clock()
        # A missing file is looked for on every call: it may be written a moment after start.
        if self._read.stamp is not None and self._checked_at is not None and now - self._checked_at < self.recheck_s:
            return self._read.value
        self._checked_at = now
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


class DeploymentCredential(TokenFile):
    """A process's internal credential: its deployment's token file, and while the deployment
    upgrades from a namespace credential, the namespace's token (``legacy``).

    While the legacy token is there it is what this process sends (pods that have not rolled
    yet know only it) and it is accepted beside the deployment's own; once it is gone it is
    still accepted for :data:`LEGACY_GRACE_S` (the pods' files update at different times), then
    refused. ``also``: tokens accepted but never sent (local mode's run credential, at routers)."""

    def __init__(self, path: Path, legacy: TokenFile | None = None, also: tuple[TokenFile, ...] = (), *,
                 grace_s: float = LEGACY_GRACE_S, clock: Callable[[], float] = time.monotonic,
                 recheck_s: float = RECHECK_S):
        super().__init__(path, recheck_s=recheck_s, clock=clock)
        self.legacy = legacy
        self.also = also
        self.grace_s = grace_s
        self._legacy_seen: tuple[str, float] | None = None  # the legacy token, when last seen

    def own(self) -> str | None:
        """The deployment's own token (None while its file is missing or empty)."""
        return super().token()

    def _legacy(self) -> str | None:
        value = self.legacy.token() if self.legacy is not None else None
        if value is not None:
            self._legacy_seen = (value, self.clock())
        return value

    def token(self) -> str | None:
        """What to send: the namespace's token while the upgrade lasts, else the deployment's."""
        return self._legacy() or self.own()

    def accepts(self, sent: str | None) -> bool:
        if sent is None:
            return False
        own = self.own()
        if (own is not None and same_token(sent, own)) or any(other.accepts(sent) for other in self.also):
            return True
        legacy = self._legacy()
        if legacy is None and self._legacy_seen is not None and self.clock() - self._legacy_seen[1] < self.grace_s:
            legacy = self._legacy_seen[0]
        return legacy is not None and same_token(sent, legacy)


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


class CallerTokens(ClientTokens):
    """A router's callers: a folder, one file per calling deployment (named after it) holding
    that deployment's credential. In pods a projected Secret volume (its ``..data`` link swaps on
    update); in local mode links to the callers' own token files, so each file's own change is
    watched too. :data:`RESERVED_CLIENT` is never a caller."""

    def _stamp(self) -> tuple[int, int, int] | None:
        folder = super()._stamp()
        if folder is None:
            return None
        try:
            entries = sorted(self.path.iterdir())
        except OSError:
            return folder
        stamps = [folder]
        for entry in entries:
            try:
                info = entry.stat()
            except OSError:
                continue
            stamps.append((info.st_ino, info.st_mtime_ns, info.st_size))
        return hash(tuple(stamps)), len(stamps), 0

    def _load(self) -> dict[str, str]:
        tokens = super()._load()
        tokens.pop(RESERVED_CLIENT, None)
        return tokens


#: The credential ``serve.run`` made for its script's handles (not put in ``os.environ``, so the
#: processes the script starts by other means are not handed it).
_in_use: TokenFile | None = None


def use_internal_token(path: Path) -> None:
    """Make ``path`` this process's internal credential where the environment names none."""
    global _in_use
    _in_use = TokenFile(path)


def internal_token_file(*, accept_run: bool = False) -> TokenFile | None:
    """This process's internal credential: the file ``MODELPLEX_INTERNAL_TOKEN_FILE`` names (with
    the namespace's token of an upgrade beside it, ``MODELPLEX_LEGACY_TOKEN_FILE``, and with
    ``accept_run`` local mode's run credential, ``MODELPLEX_RUN_TOKEN_FILE``), else the one
    :func:`use_internal_token` set, else None."""
    path = os.environ.get(ENV_INTERNAL_TOKEN_FILE)
    if not path:
        return _in_use
    legacy = os.environ.get(ENV_LEGACY_TOKEN_FILE)
    run = os.environ.get(ENV_RUN_TOKEN_FILE) if accept_run else None
    return DeploymentCredential(Path(path), TokenFile(Path(legacy)) if legacy else None,
                                (TokenFile(Path(run)),) if run else ())


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path`` readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(token)
    return path
