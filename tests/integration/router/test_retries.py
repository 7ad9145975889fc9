"""The router retries a request on another replica only before the first replica sent a status
line (#37): once an answer has begun, a replica's failure is one 502, never a second run of the
handler on another replica."""

from __future__ import annotations

from pathlib import Path

import aiohttp

TIMEOUT = aiohttp.ClientTimeout(total=60)


async def test_a_replica_that_dies_after_its_status_line_is_not_retried_and_its_handler_ran_once(plex, tmp_path):
    cluster = await plex.start(replicas=2, handler="handlers:DiesAfterHead")
    runs = tmp_path / "runs"
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(cluster.router_url + "/", json={"runs": str(runs)}) as resp:
            status = resp.status
            try:
                body = await resp.read()
            except aiohttp.ClientPayloadError:
                body = b"<cut>"
    assert status == 502, (status, body)
    assert len(Path(runs).read_text().splitlines()) == 1, "the handler ran again on another replica"
    assert b"not retried" in body, body
