"""``spec.userConfig`` on live replicas (Ray's ``user_config`` and ``reconfigure``).

A replica calls its handler's ``reconfigure(config)`` with ``spec.userConfig`` before it serves
(the spec ConfigMap holds it). A change of ``userConfig`` alone rolls no pod (the pod
template's hash leaves it out): the operator sends the new value to each ready replica on the
replica's internal API, ``POST /v1/user-config`` (the deployment's internal credential), and the
replica calls ``reconfigure`` on its user-code loop. Both sides name a value by
:func:`config_hash`; a replica that already applied a value answers without calling
``reconfigure`` again, so sending it twice is harmless.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

#: The replica's route that applies a userConfig (internal: the deployment's credential).
USER_CONFIG_PATH = "/v1/user-config"
#: The request's field holding the value; the answer's holding the hash of the value the
#: handler applied, and whether its ``reconfigure`` ran for this request.
CONFIG_KEY = "userConfig"
HASH_KEY = "hash"
RECONFIGURED_KEY = "reconfigured"


def config_hash(value: Any) -> str:
    """A stable name of a JSON value (sha256 of its canonical form, 16 hex digits)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
