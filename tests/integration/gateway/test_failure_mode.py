"""With the Endpoint Picker unreachable, Envoy answers as its ext_proc failure mode says."""

from __future__ import annotations

import aiohttp

from modelplex.wire.names import MODEL_ID_HEADER

from support.envoy import start_envoy
from support.servers import free_port


async def test_with_the_picker_gone_envoy_answers_its_failure_mode(processes):
    """``failure_mode_allow: false`` (FailClose): Envoy answers 500 with an empty body."""
    envoy = start_envoy(processes, free_port(), modes=("NONE",), name="envoy-no-picker")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.post(envoy.urls["NONE"] + "/", json={}, headers={MODEL_ID_HEADER: "m"}) as answer:
            assert answer.status == 500
            assert await answer.read() == b""
