"""The proof a replica takes, behind a Gateway, instead of the deployment's internal credential.

Behind a Gateway (the router's Endpoint Picker, :mod:`modelplex_router.picker`) the bytes of a
request go from the Gateway's data plane straight to a replica: no router sends the internal
credential, and the Gateway must never hold it. The picker admits the request and attaches a
proof instead, bound to exactly one model, one replica address (``ip:port``, the socket the
request arrives on) and an expiry a few seconds ahead, signed with a key derived from the
deployment's internal credential (HMAC-SHA256). A replica accepts it for that one model on its
own address only, before the expiry, and removes it (an internal header) before user code.
A client cannot make one (it lacks the key), and one it sees cannot be sent to another model or
replica, nor used once expired.

Form: ``v1.<expiry, unix seconds>.<hex HMAC>`` in :data:`PROOF_HEADER`; where the picker names
fallback replicas (``spec.router.endpointPicker.fallbacks``) the Gateway may send the request to
any of them, so the header carries one proof per replica, comma-separated (at most
:data:`MAX_PROOFS`), and a replica accepts the one bound to itself. Times are wall-clock
seconds (the router and the replicas are different processes, often different machines); the
lifetime covers the Gateway's hop and a clock skew of a few seconds. Pure functions: the
caller passes the credential and the time.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

#: Picker → Gateway → replica: the request's proof (an internal header: clients never send it).
PROOF_HEADER = "X-Modelplex-Proof"
#: How long a proof is good for, in seconds: the Gateway's hop to the replica, and clock skew.
PROOF_TTL_S = 10.0
_VERSION = "v1"
#: The most proofs one header may carry (the pick and its fallbacks); more are not looked at.
MAX_PROOFS = 8
#: Keeps a proof's key apart from the credential itself (never used raw as a MAC key).
_KEY_LABEL = b"modelplex endpoint picker proof v1"


def endpoint(host: str, port: int) -> str:
    """``ip:port`` as a Gateway names an endpoint and a proof binds it (IPv6 bracketed)."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@functools.lru_cache(maxsize=4)  # one credential (two while it rotates): derived once, not per request
def _key(credential: str) -> bytes:
    return hmac.new(credential.encode(), _KEY_LABEL, hashlib.sha256).digest()


def _mac(credential: str, model: str, replica: str, expiry: int) -> str:
    # Lengths first: no two (model, replica) pairs sign the same bytes, whatever they contain.
    message = f"{_VERSION}\n{len(model)}:{model}\n{len(replica)}:{replica}\n{expiry}".encode()
    return hmac.new(_key(credential), message, hashlib.sha256).hexdigest()


def make_proof(credential: str, model: str, replica: str, now: float, ttl_s: float = PROOF_TTL_S) -> str:
    """A proof that a request for ``model`` may reach the replica at ``replica`` (``ip:port``)
    until ``now + ttl_s`` (wall-clock seconds), signed with the deployment's ``credential``."""
    expiry = int(now + ttl_s)
    return f"{_VERSION}.{expiry}.{_mac(credential, model, replica, expiry)}"


def check_proof(credentials: tuple[str, ...], proof: str | None, model: str, replica: str, now: float,
                max_ttl_s: float = PROOF_TTL_S) -> bool:
    """Whether ``proof`` admits a request for ``model`` to ``replica`` at ``now``, signed with one
    of ``credentials`` (the deployment's; during a credential upgrade, two). An expiry further
    ahead than ``max_ttl_s`` (and a second of rounding) is refused too: nobody mints long-lived ones.
    A comma-separated list of proofs (the pick's and its fallbacks') admits when one of its first
    :data:`MAX_PROOFS` does."""
    if not proof or not credentials:
        return False
    return any(_checked(credentials, one.strip(), model, replica, now, max_ttl_s)
               for one in proof.split(",", MAX_PROOFS)[:MAX_PROOFS])


def _checked(credentials: tuple[str, ...], proof: str, model: str, replica: str, now: float, max_ttl_s: float
             ) -> bool:
    version, _, rest = proof.partition(".")
    stamp, _, mac = rest.partition(".")
    if version != _VERSION or not stamp.isdigit() or len(stamp) > 12 or not mac:
        return False
    expiry = int(stamp)
    if not now <= expiry <= now + max_ttl_s + 1:
        return False
    return any(hmac.compare_digest(mac, _mac(credential, model, replica, expiry)) for credential in credentials)
