"""Every error the HTTP layer answers is JSON, including aiohttp's parser-level 400s that no
handler or middleware sees: on the router (public) and on a replica (internal)."""

from __future__ import annotations

import asyncio
import json

import aiohttp

MALFORMED = {
    "a 64 KB header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n",
    "200 headers": b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n",
    "a NUL in a header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n",
    "a garbage request line": b"\x16\x03\x01 NOT HTTP AT ALL\r\n\r\n",
    "a bad method": b"G(E)T / HTTP/1.1\r\nHost: x\r\n\r\n",
}


async def raw_exchange(url: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)  # the server closes after an error
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


async def test_parser_level_errors_are_json(plex):
    cluster = await plex.start(replicas=1)
    for case, data in MALFORMED.items():
        for url in (cluster.router_url, *cluster.replica_urls.values()):
            status, headers, body = await raw_exchange(url, data)
            assert status == 400, (case, url, status, body[:200])
            assert headers["content-type"].startswith("application/json"), (case, url, headers)
            error = json.loads(body)["error"]
            assert error["code"] == "bad_request" and error["message"].startswith("malformed HTTP request"), error
    # What aiohttp reports (the header errors; it says nothing of a garbage request line) is one
    # WARNING line each: a client's mistake, not a server error with a traceback.
    for proc in (cluster.router_proc, *cluster.replica_procs.values()):
        log = proc.log.read_text()
        assert log.count("WARNING modelplex.serving: malformed request from 127.0.0.1: ") >= 3, log[-2000:]
        assert "Traceback" not in log and "ERROR aiohttp.server" not in log, log[-2000:]
    # Both are still healthy after all that.
    async with aiohttp.ClientSession() as session:
        for url in (cluster.router_url, *cluster.replica_urls.values()):
            async with session.get(url + "/healthz") as response:
                assert response.status == 200
