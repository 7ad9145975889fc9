"""The operator's one HTTP client of its pods: the routers' load reports, the replicas'
loaded-models documents, model loads, pins and user configs.

Every call the operator makes to a pod goes through :class:`PodClient`, so they share:

- one aiohttp session for the operator's lifetime (made on first use, closed at cleanup), never
  through a proxy (``trust_env=False``: straight to the pod IP) and without cookies;
- URLs from :func:`modelplex.wire.hosts.base_url`: an IPv6 pod IP is bracketed;
- the internal credential (replicas and routers answer nobody without it), looked up per
  deployment by the ``credential`` the client is given: today the namespace's token, so a
  change to per-deployment credentials changes only that function;
- one timeout policy: a connect is bounded by :data:`CONNECT_TIMEOUT_S`, and every call by a
  total of its own kind (a load report :data:`~modelplex.autoscaling.READ_TIMEOUT_S`, a
  document :data:`~modelplex.loaded_client.FETCH_TIMEOUT_S`, a model load
  :data:`~modelplex.autoscaling.MOVE_TIMEOUT_S`, a pin the deployment's load timeout);
- one way to fail: :class:`PodCallError` (the document read keeps its
  :class:`~modelplex.loaded_client.DocumentUnavailable`), whose message says why.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Mapping
from urllib.parse import quote

import aiohttp

from modelplex.autoscaling import MOVE_TIMEOUT_S, READ_TIMEOUT_S
from modelplex.loaded_client import FETCH_TIMEOUT_S, fetch_loaded_models
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER
from modelplex.wire.hosts import base_url
from modelplex.wire.load import LOAD_PATH, LoadReport
from modelplex.wire.loaded import LoadedModels
from modelplex.wire.names import REPLICA_PORT
from modelplex.wire.pins import LEASE_S, PINS_PATH, PinRequest
from modelplex.wire.user_config import CONFIG_KEY, HASH_KEY, RECONFIGURED_KEY, USER_CONFIG_PATH
from modelplex_operator.status import Key

#: Connecting to a pod: on the cluster network a live pod accepts at once.
CONNECT_TIMEOUT_S = 2.0


class PodCallError(Exception):
    """A call to a pod gave no usable answer; the message says why (for logs and status)."""


class ReplicaRefused(PodCallError):
    """The replica answered, with an error (asking again with the same request would not help)."""


class PodClient:
    """The operator's calls to its pods (one per operator process: see the module's notes).

    ``credential(key)``: the internal token to send to the pods of deployment ``key``
    (``(namespace, name)``), None for none."""

    def __init__(self, credential: Callable[[Key], str | None] = lambda key: None, *,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.credential = credential
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The one session (made in the running loop on first use)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,  # straight to the pod, never through a proxy
            )
        return self._session

    def headers(self, key: Key) -> dict[str, str] | None:
        """The credential header for the pods of ``key``."""
        token = self.credential(key)
        return {INTERNAL_TOKEN_HEADER: token} if token else None

    def _timeout(self, total_s: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total_s, sock_connect=min(total_s, self.connect_timeout_s))

    async def load_report(self, key: Key, ip: str, port: int, *, timeout_s: float = READ_TIMEOUT_S) -> LoadReport:
        """A router pod's ``GET /v1/load``."""
        url = base_url(ip, port) + LOAD_PATH
        try:
            async with self.session().get(url, headers=self.headers(key), timeout=self._timeout(timeout_s)) as answer:
                if answer.status != 200:
                    raise PodCallError(f"{url}: HTTP {answer.status}")
                return LoadReport.from_json(await answer.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as error:
            raise PodCallError(f"{url}: {_why(error, timeout_s)}") from None

    async def loaded_models(self, key: Key, ip: str, *, port: int = REPLICA_PORT,
                            timeout_s: float = FETCH_TIMEOUT_S) -> LoadedModels:
        """A replica pod's ``GET /v1/models``; raises
        :class:`~modelplex.loaded_client.DocumentUnavailable` (with its size limits)."""
        return await fetch_loaded_models(self.session(), base_url(ip, port), timeout_s=timeout_s,
                                         headers=self.headers(key))

    async def load_model(self, key: Key, ip: str, model: str, *, port: int = REPLICA_PORT,
                         timeout_s: float = MOVE_TIMEOUT_S) -> None:
        """Load ``model`` on a replica pod (``POST /v1/models/{id}/load``), waiting for it."""
        url = f"{base_url(ip, port)}/v1/models/{quote(model, safe='')}/load"
        try:
            async with self.session().post(url, headers=self.headers(key), timeout=self._timeout(timeout_s)) as answer:
                if answer.status != 200:
                    raise PodCallError(f"HTTP {answer.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
            raise PodCallError(_why(error, timeout_s)) from None

    async def pin(self, key: Key, ip: str, models: tuple[str, ...], *, timeout_s: float,
                  port: int = REPLICA_PORT) -> Mapping[str, Any]:
        """Pin ``models`` on a replica pod for a lease (``POST /v1/pins`` with ``wait``) and wait
        for their loads; the answer's ``errors`` (model -> why it did not load)."""
        url = base_url(ip, port) + PINS_PATH
        body = PinRequest(models, LEASE_S, wait=True).to_dict()
        try:
            async with self.session().post(url, json=body, headers=self.headers(key),
                                           timeout=self._timeout(timeout_s)) as answer:
                if answer.status != 200:
                    raise PodCallError(f"HTTP {answer.status}")
                errors = (await answer.json()).get("errors") or {}
                return dict(errors) if isinstance(errors, dict) else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError) as error:
            raise PodCallError(_why(error, timeout_s)) from None

    async def reconfigure(self, key: Key, ip: str, config: Any, *, timeout_s: float,
                          port: int = REPLICA_PORT) -> tuple[str, bool]:
        """Give a replica pod's handler ``config`` (``POST /v1/user-config``: its ``reconfigure``
        runs unless it applied that value already); the hash of the value it applied, and
        whether its ``reconfigure`` ran for it. A
        :class:`ReplicaRefused` when the replica answered with an error (its message: why)."""
        url = base_url(ip, port) + USER_CONFIG_PATH
        try:
            async with self.session().post(url, json={CONFIG_KEY: config}, headers=self.headers(key),
                                           timeout=self._timeout(timeout_s)) as answer:
                if answer.status != 200:
                    # 400: the handler has no reconfigure; 500: its reconfigure raised. Anything
                    # else (a rotating credential, a draining pod) may pass: asked again later.
                    kind = ReplicaRefused if answer.status in (400, 500) else PodCallError
                    raise kind(f"HTTP {answer.status}: {_error_message(await answer.read())}")
                document = await answer.json()
                return str(document.get(HASH_KEY) or ""), bool(document.get(RECONFIGURED_KEY))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError) as error:
            raise PodCallError(_why(error, timeout_s)) from None

    async def close(self) -> None:
        """At the operator's cleanup."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _error_message(body: bytes) -> str:
    """The message of a pod's JSON error answer (its first 300 characters), else the body's."""
    try:
        error = json.loads(body).get("error") or {}
        message = str(error.get("message") or "") if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        message = body.decode(errors="replace")
    return message[:300] or "no message"


def _why(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return str(error) or type(error).__name__
