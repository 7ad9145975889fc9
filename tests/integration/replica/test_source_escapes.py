"""No id leaves its source's prefix, and no source credential reaches a client or a log.

Against a real HTTP store on loopback that decodes ``%2F`` and resolves dot segments as nginx
does (the ``store`` fixture), with the replica's own source code and, end to end, a replica
process serving the built-in handler.
"""

from __future__ import annotations

import io
import json
import warnings

import aiohttp
import pytest
import torch

from modelplex.wire.ids import InvalidModelId
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex_replica.sources import ModelSource, source_headers

from support.servers import MODELPLEX, wait_ready
from support.stacks import start_local

PREFIX = "/store/tenant-a/"
PASSWORD = "pa55-w0rd-xyz"
TOKEN = "t0ken-sig-abc"
#: Ids a hostile or careless client may send: climbing, absolute, encoded, double-encoded,
#: backslashes, a neighbour tenant's name.
HOSTILE_IDS = [
    "..", ".", "../tenant-b/private", "../model", "..%2Fmodel", "%2e%2e", "%2E%2E/model", "%2e%2e%2fmodel",
    "%252e%252e/model", "..\\model", "a/../../model", "a/%2e%2e/%2e%2e/model", "%2F..%2F..%2Fmodel",
    "/tenant-b/private", "//127.0.0.1/store/model", "tenant-b%2F..%2F..%2Fmodel", "..;/model", ".%2e/model",
    "..%5Cmodel", "x/%2E%2E", "%2F%2Fevil.example/model", "model?x=1", "model#frag", "%00../model",
]


def scripted(seed: int) -> bytes:
    torch.manual_seed(seed)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2).eval()), buffer)
    return buffer.getvalue()


@pytest.fixture
def tenants(store):
    """tenant-a's models, tenant-b's private one, and a model at the store's root (outside any prefix)."""
    (store.root / "tenant-a").mkdir()
    (store.root / "tenant-b").mkdir()
    (store.root / "tenant-a" / "m1.pt").write_bytes(scripted(1))
    (store.root / "tenant-a" / "m1").mkdir()
    (store.root / "tenant-a" / "m1" / "model.pt").write_bytes(scripted(1))
    (store.root / "tenant-b" / "private.pt").write_bytes(b"tenant-b secret")
    (store.root / "model.pt").write_bytes(b"outside the prefix")
    (store.root / "model").mkdir()
    (store.root / "model" / "model.pt").write_bytes(b"outside the prefix too")
    return store


@pytest.mark.parametrize("template", ["{model_id}.pt", "{model_id}/model.pt"])
async def test_no_hostile_id_fetches_outside_its_prefix(tenants, template):
    source = ModelSource(f"{tenants.url}{PREFIX}{template}", headers={})
    outcomes = {}
    for model_id in HOSTILE_IDS:
        try:
            outcomes[model_id] = await source.fetch(model_id)
        except InvalidModelId:
            outcomes[model_id] = "refused"
        except Exception as error:  # noqa: BLE001 - what else happens is reported below
            outcomes[model_id] = type(error).__name__
    assert not any(isinstance(got, bytes) for got in outcomes.values()), outcomes
    assert all(got in ("refused", "ModelNotFound") for got in outcomes.values()), outcomes
    assert tenants.fetches, "some hostile ids are valid names inside the prefix and were fetched"
    outside = [(f.target, f.path) for f in tenants.fetches if not f.path.startswith(PREFIX)]
    assert outside == []
    for refused in ("..", "%2e%2e", "../tenant-b/private", "%252e%252e/model", "..\\model"):
        assert outcomes[refused] == "refused"
    assert await source.fetch("m1") == scripted(1)  # the prefix still serves its own models


async def test_a_signed_url_and_userinfo_reach_the_store_but_no_message(tenants):
    uri = f"http://reader:{PASSWORD}@{tenants.url.removeprefix('http://')}{PREFIX}{{model_id}}.pt?sig={TOKEN}&expires=9"
    source = ModelSource(uri, headers={})
    assert await source.fetch("m1") == scripted(1)
    fetch = tenants.fetches[-1]
    assert fetch.query == f"sig={TOKEN}&expires=9"  # unchanged, as signed
    assert fetch.headers["Authorization"].startswith("Basic ")
    with pytest.raises(Exception) as missing:
        await source.fetch("nope")
    message = str(missing.value)
    assert "nope" in message and "sig=REDACTED" in message
    assert PASSWORD not in message and TOKEN not in message
    assert PASSWORD not in source.shown and TOKEN not in source.shown


async def test_source_headers_from_the_secret_reach_the_store(tenants):
    headers = source_headers({"MODELPLEX_SOURCE_HEADER_AUTHORIZATION": f"Bearer {TOKEN}",
                              "MODELPLEX_SOURCE_HEADER_X_API_KEY": "k", "UNRELATED": "x"})
    assert headers == {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": "k"}
    source = ModelSource(f"{tenants.url}{PREFIX}{{model_id}}.pt", headers=headers)
    assert await source.fetch("m1") == scripted(1)
    assert tenants.fetches[-1].headers["Authorization"] == f"Bearer {TOKEN}"
    assert tenants.fetches[-1].headers["X-Api-Key"] == "k"


async def test_a_replica_never_shows_a_source_credential(processes, tmp_path, tenants):
    uri = f"http://reader:{PASSWORD}@{tenants.url.removeprefix('http://')}{PREFIX}{{model_id}}.pt?sig={TOKEN}"
    manifest = tmp_path / "creds.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "creds"},
        "spec": {"image": "local", "modelSource": {"uri": uri}, "batching": {"batchWaitTimeoutMs": 1}}}))
    replica = processes.replica(manifest, env={"MODELPLEX_SOURCE_HEADER_X_TENANT": "a"})
    bodies = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await wait_ready(session, replica)

        async def call(model_id: str) -> int:
            async with session.post(replica.url + "/v1/invoke", json={"inputs": [1.0, 2.0, 3.0]},
                                    headers={MODEL_ID_HEADER: model_id}) as response:
                bodies.append(await response.text())
                return response.status

        assert await call("m1") == 200
        assert await call("missing") == 404
        assert await call("../tenant-b/private") == 400
        assert await call("%2e%2e") == 400
        async with session.get(replica.url + "/v1/models") as response:
            models = await response.text()
        async with session.get(replica.url + "/metrics") as response:
            metrics = await response.text()
    assert tenants.fetches[0].headers["X-Tenant"] == "a"
    assert all(f.path.startswith(PREFIX) for f in tenants.fetches)
    assert "missing" in models and "REDACTED" in models  # the failure is reported, redacted
    log = replica.log.read_text(errors="replace")
    assert "missing" in log  # the failed load is logged
    for text in [*bodies, models, metrics, log]:
        assert PASSWORD not in text and TOKEN not in text


def test_modelplex_local_refuses_a_model_id_in_the_host(processes, tmp_path):
    manifest = tmp_path / "host.yaml"
    manifest.write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "host"},
        "spec": {"image": "local", "modelSource": {"uri": f"https://u:{PASSWORD}@{{model_id}}.store.example/m.pt"}}}))
    proc = processes.start("local", [*MODELPLEX, "local", str(manifest)])
    assert proc.popen.wait(timeout=120) != 0
    output = proc.log.read_text(errors="replace")
    assert "spec.modelSource.uri" in output and "host" in output
    assert PASSWORD not in output


async def test_modelplex_local_sends_the_source_secret_as_a_header_and_shows_it_nowhere(processes, tmp_path, tenants):
    documents = [
        {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "creds"},
         "spec": {"replicas": 1, "image": "local", "batching": {"batchWaitTimeoutMs": 1},
                  "modelSource": {"uri": f"{tenants.url}{PREFIX}{{model_id}}.pt?sig={TOKEN}",
                                  "secretRef": {"name": "store-reader"}}}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "store-reader"},
         "stringData": {"MODELPLEX_SOURCE_HEADER_AUTHORIZATION": f"Bearer {PASSWORD}"}},
    ]
    manifest = tmp_path / "local-creds.yaml"
    manifest.write_text("\n---\n".join(json.dumps(document) for document in documents))
    stack = start_local(processes, manifest, 1)
    url = stack.urls["creds"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        answers = []
        for model_id in ("m1", "missing", "../tenant-b/private"):
            async with session.post(url + "/", json={"inputs": [1.0, 2.0, 3.0]},
                                    headers={MODEL_ID_HEADER: model_id}) as response:
                answers.append((response.status, await response.text()))
        async with session.get(url + "/metrics") as response:
            metrics = await response.text()
    assert [status for status, _ in answers] == [200, 404, 400]
    assert {f.headers.get("Authorization") for f in tenants.fetches} == {f"Bearer {PASSWORD}"}
    assert all(f.query == f"sig={TOKEN}" and f.path.startswith(PREFIX) for f in tenants.fetches)
    log = stack.proc.log.read_text(errors="replace")
    for text in [*(body for _, body in answers), metrics, log]:
        assert PASSWORD not in text and TOKEN not in text


async def _recording_server(host: str, routes) -> tuple[aiohttp.web.AppRunner, str, list[dict[str, str]]]:
    """A real HTTP server on ``host`` that records each request's headers."""
    from aiohttp import web

    from support.servers import free_port

    seen: list[dict[str, str]] = []

    @web.middleware
    async def record(request, handler):
        seen.append(dict(request.headers))
        return await handler(request)

    app = web.Application(middlewares=[record])
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, host, port).start()
    return runner, f"http://{host}:{port}", seen


async def test_source_secret_headers_never_follow_a_redirect_to_another_origin():
    from aiohttp import web

    async def model(request):
        return web.Response(body=b"model bytes")

    elsewhere, elsewhere_url, elsewhere_seen = await _recording_server("127.0.0.2", {"/blob/m.pt": model})

    async def moved_away(request):
        raise web.HTTPFound(f"{elsewhere_url}/blob/m.pt")

    async def moved_here(request):
        raise web.HTTPTemporaryRedirect("/models/m.pt")

    store, store_url, store_seen = await _recording_server(
        "127.0.0.1", {"/away/m.pt": moved_away, "/here/m.pt": moved_here, "/models/m.pt": model})
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": PASSWORD}
    try:
        away = ModelSource(store_url + "/away/{model_id}.pt", headers=headers)
        assert await away.fetch("m") == b"model bytes"
        assert store_seen[-1]["Authorization"] == f"Bearer {TOKEN}"  # the source itself gets them
        leaked = [value for sent in elsewhere_seen for value in sent.values() if TOKEN in value or PASSWORD in value]
        assert len(elsewhere_seen) == 1 and leaked == []

        here = ModelSource(store_url + "/here/{model_id}.pt", headers=headers)
        assert await here.fetch("m") == b"model bytes"
        assert store_seen[-1]["X-Api-Key"] == PASSWORD  # a redirect within the origin keeps them
    finally:
        await store.cleanup()
        await elsewhere.cleanup()
