"""The router's edges for browsers and careless clients: CORS preflights never reach a handler,
an EventSource names its model in the URL, a trickled body gets 408, the access log."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from modelplex.processes import consecutive_free_ports

from support.servers import Processes
from support.stacks import Stack, manifest, start_local, write_documents

HERE = Path(__file__).resolve().parent
#: The page of another origin that the browser test serves (its port drawn now: the stack's CORS
#: configuration names it).
PAGE_PORT = consecutive_free_ports(1)
ORIGIN = f"http://127.0.0.1:{PAGE_PORT}"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "serve_multiplexed_model_id, content-type"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    processes = Processes(tmp_path_factory.mktemp("browsers"))
    shutil.copy(HERE / "handlers.py", processes.folder / "handlers.py")
    documents = [
        manifest("plain", "handlers:Counter", router={"bodyTimeoutSeconds": 2}),
        manifest("open", "handlers:Tokens", router={"cors": {"allowOrigins": [ORIGIN]}, "accessLog": True}),
    ]
    try:
        yield start_local(processes, write_documents(processes.folder / "browsers.yaml", documents), deployments=2)
    except BaseException:
        print(processes.report())
        raise
    finally:
        processes.stop_all()


async def test_a_preflight_without_cors_configured_is_answered_by_the_router_and_never_calls_the_handler(stack):
    router = stack.url("plain")
    async with aiohttp.ClientSession() as session:
        for path in ("/", "/v1/models/m1/predict", "/anything/below"):
            async with session.options(router + path, headers=PREFLIGHT) as response:
                assert response.status == 204
                assert "Access-Control-Allow-Origin" not in response.headers
        async with session.post(router + "/", json={}, headers={"serve_multiplexed_model_id": "m1"}) as response:
            assert (await response.json())["calls"] == 1  # the first call the handler ever got


async def test_an_allowed_origin_gets_its_preflight_and_an_event_stream_named_by_url(stack):
    router = stack.url("open")
    async with aiohttp.ClientSession() as session:
        async with session.options(router + "/v1/models/m1/predict", headers=PREFLIGHT) as response:
            assert response.status == 204
            assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
            assert "serve_multiplexed_model_id" in response.headers["Access-Control-Allow-Headers"]
        # What an EventSource sends: a GET, no body, no custom header.
        async with session.get(router + "/v1/models/m1/predict?lang=en",
                               headers={"Origin": ORIGIN, "Accept": "text/event-stream"}) as response:
            assert response.status == 200
            assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
            assert response.content_type == "text/event-stream"
            events = [json.loads(line[len("data: "):]) for line in (await response.text()).splitlines()
                      if line.startswith("data: ")]
        assert [event["step"] for event in events] == [0, 1, 2]
        assert {event["model"] for event in events} == {"m1"} and events[2]["value"] == 12.0
        async with session.get(router + "/v1/models/m1/predict",
                               headers={"Origin": "http://elsewhere.example", "Accept": "text/event-stream"}) as response:
            assert "Access-Control-Allow-Origin" not in response.headers


def test_a_body_that_trickles_in_gets_408_within_the_body_timeout(stack):
    address = urlsplit(stack.url("plain"))
    with socket.create_connection((address.hostname, address.port), timeout=30) as connection:
        connection.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"serve_multiplexed_model_id: m1\r\nContent-Length: 100\r\n\r\n{\"a\":")
        start = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = connection.recv(4096)
            if not chunk:
                break
            answer += chunk
        waited = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert 1.5 <= waited <= 2 + 10  # the 2 s timeout, with room for a busy machine


async def test_the_access_log_records_every_request_without_tokens(stack):
    router = stack.url("open")
    async with aiohttp.ClientSession() as session:
        async with session.get(router + "/v1/models/m2/predict?access_token=s3cr3t-value",
                               headers={"Accept": "text/event-stream"}) as response:
            await response.read()
        async with session.post(router + "/v2/repository/models/m2/unload") as response:
            assert response.status == 403

    def lines() -> list[dict]:
        found = []
        for line in stack.proc.log.read_text().splitlines():
            start = line.find('{"time"')
            if "modelplex.access" in line and start >= 0:
                found.append(json.loads(line[start:]))
        return found

    for _ in range(100):
        records = lines()
        if any(r["path"] == "/v2/repository/models/m2/unload" for r in records):
            break
        await asyncio.sleep(0.1)
    by_path = {r["path"]: r for r in records}
    assert by_path["/v1/models/m2/predict"]["status"] == 200 and by_path["/v1/models/m2/predict"]["model"] == "m2"
    assert by_path["/v2/repository/models/m2/unload"]["status"] == 403
    assert "s3cr3t-value" not in stack.proc.log.read_text()


EVENT_PAGE = """<!doctype html><html><body><ul id="got"></ul><script>
const source = new EventSource("%(router)s/v1/models/m1/predict");
source.onmessage = (event) => {
  const item = document.createElement("li");
  item.textContent = event.data;
  document.getElementById("got").appendChild(item);
  if (document.querySelectorAll("li").length === 3) { source.close(); document.title = "done"; }
};
</script></body></html>"""

FETCH_PAGE = """<!doctype html><html><body><p id="result">pending</p><script>
fetch("%(router)s/", {method: "POST", body: "{}",
      headers: {"Content-Type": "application/json", "serve_multiplexed_model_id": "m9"}})
  .then((r) => r.text()).then((text) => { document.getElementById("result").textContent = "answered " + text; })
  .catch((error) => { document.getElementById("result").textContent = "blocked"; });
</script></body></html>"""


async def browse(page: str, tmp_path: Path) -> str:
    """Serve ``page`` on the other origin and let headless Chromium run it; its DOM after."""
    async def serve_page(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", serve_page)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PAGE_PORT).start()
    try:
        chromium = await asyncio.create_subprocess_exec(
            shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000", "--dump-dom", ORIGIN + "/",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        try:
            dom, _ = await asyncio.wait_for(chromium.communicate(), timeout=120)
        finally:
            if chromium.returncode is None:
                chromium.kill()
                await chromium.wait()
        return dom.decode()
    finally:
        await runner.cleanup()


async def test_headless_chromium_on_another_origin_receives_an_event_stream_chunk_by_chunk(stack, tmp_path):
    dom = await browse(EVENT_PAGE % {"router": stack.url("open")}, tmp_path)
    chunks = [json.loads(item) for item in re.findall(r"<li>(.*?)</li>", dom)]
    assert [chunk["step"] for chunk in chunks] == [0, 1, 2], dom
    assert {chunk["model"] for chunk in chunks} == {"m1"}


async def test_headless_chromium_is_refused_by_a_router_without_cors_and_the_handler_is_never_called(stack, tmp_path):
    router = stack.url("plain")
    async with aiohttp.ClientSession() as session:
        async with session.post(router + "/", json={}, headers={"serve_multiplexed_model_id": "m9"}) as response:
            before = (await response.json())["calls"]
    dom = await browse(FETCH_PAGE % {"router": router}, tmp_path)
    assert '<p id="result">blocked</p>' in dom, dom
    async with aiohttp.ClientSession() as session:
        async with session.post(router + "/", json={}, headers={"serve_multiplexed_model_id": "m9"}) as response:
            assert (await response.json())["calls"] == before + 1  # the browser's call never reached it


DOCUMENTED_REQUEST_HEADERS = ("serve_multiplexed_model_id", "serve-multiplexed-model-id", "authorization",
                              "content-type", "x-modelplex-on-cold", "inference-header-content-length")


async def test_a_preflight_allows_every_documented_request_header_and_answers_expose_what_a_page_reads(stack):
    router = stack.url("open")
    asked = {**PREFLIGHT, "Access-Control-Request-Headers": ", ".join(DOCUMENTED_REQUEST_HEADERS)}
    async with aiohttp.ClientSession() as session:
        async with session.options(router + "/v2/models/m1/infer", headers=asked) as response:
            assert response.status == 204
            allowed = {name.strip().lower() for name in response.headers["Access-Control-Allow-Headers"].split(",")}
            assert set(DOCUMENTED_REQUEST_HEADERS) <= allowed, allowed
        async with session.post(router + "/", json={}, headers={"Origin": ORIGIN, "serve_multiplexed_model_id": "m1",
                                                               "x-modelplex-on-cold": "hold"}) as response:
            assert response.status == 200
            exposed = {name.strip().lower() for name in response.headers["Access-Control-Expose-Headers"].split(",")}
            await response.read()
    assert {"retry-after", "inference-header-content-length", "www-authenticate", "x-modelplex-replica"} <= exposed


ON_COLD_PAGE = """<!doctype html><html><body><p id="result">pending</p><script>
fetch("%(router)s/", {method: "POST", body: "{}",
      headers: {"Content-Type": "application/json", "serve_multiplexed_model_id": "m9", "x-modelplex-on-cold": "hold",
                "Inference-Header-Content-Length": "2"}})
  .then((r) => r.text().then(() => {
    document.getElementById("result").textContent = "answered " + r.status + " by " + r.headers.get("X-Modelplex-Replica");
  }))
  .catch((error) => { document.getElementById("result").textContent = "blocked"; });
</script></body></html>"""


async def test_headless_chromium_sends_the_documented_headers_and_reads_the_exposed_ones(stack, tmp_path):
    dom = await browse(ON_COLD_PAGE % {"router": stack.url("open")}, tmp_path)
    found = re.search(r'<p id="result">answered 200 by (\S+)</p>', dom)
    assert found and found.group(1) not in ("null", ""), dom


async def test_the_openapi_document_leaves_the_router_s_own_paths_out_of_the_handler_s_catch_all(stack):
    router = stack.url("plain")
    async with aiohttp.ClientSession() as session:
        async with session.get(router + "/openapi.json") as response:
            document = await response.json()
        async with session.post(router + "/v2") as response:  # the router's own path: 405 with Allow
            assert response.status == 405 and "GET" in response.headers["Allow"]
    tail = next(p for p in document["paths"]["/{path}"]["post"]["parameters"] if p["name"] == "path")
    pattern = re.compile(tail["schema"]["pattern"])
    for own in ("v2", "healthz", "readyz", "openapi.json"):
        assert not pattern.search(own), own
    assert pattern.search("generate") and pattern.search("metrics")  # the handler's, as in Ray
    assert "/metrics" not in document["paths"]  # on the control port only
