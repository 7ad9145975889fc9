"""The replica's intake removes every internal header before user code sees a request: a real
replica app on loopback, guarded by an internal credential, whose ``serve.ingress`` app echoes
the headers of its ASGI scope."""

from __future__ import annotations

import json
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from modelplex.serve.ingress import ingress
from modelplex.wire.credentials import INTERNAL_TOKEN_HEADER, TokenFile, write_token_file
from modelplex.wire.forwarded import ENV_ROUTE_PREFIX, METHOD_HEADER, PATH_HEADER
from modelplex.wire.names import MODEL_ID_HEADER
from modelplex.wire.oip import PROTOCOL_HEADER, VERSION_HEADER
from modelplex.wire.proof import PROOF_HEADER, make_proof
from modelplex.wire.spec import parse_deployment
from modelplex_replica.app import create_app

DEPLOYMENT = parse_deployment({"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                               "metadata": {"name": "echo"}, "spec": {"image": "x", "handler": "m:Echo"}})
TOKEN = "internal-credential-0123456789"


async def echo_headers(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    body = json.dumps({"headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
                       "method": scope["method"], "path": scope["path"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@ingress(echo_headers)
class Echo:
    pass


@pytest.fixture
async def replica(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_ROUTE_PREFIX, "/")
    internal = TokenFile(write_token_file(tmp_path / "internal", TOKEN))
    async with TestClient(TestServer(create_app(DEPLOYMENT, Echo(), internal=internal), host="127.0.0.1")) as client:
        yield client


async def test_an_ingress_app_sees_the_clients_headers_and_no_internal_one(replica):
    sent = {INTERNAL_TOKEN_HEADER: TOKEN, METHOD_HEADER: "PUT", PATH_HEADER: "/items/a%2Fb?q=1",
            PROTOCOL_HEADER: "oip-v2", VERSION_HEADER: "1", "X-Modelplex-Anything-Later": "x",
            "x-modelplex-on-cold": "reject", "Cookie": "session=1", "Authorization": "Basic Zm9vOmJhcg==",
            MODEL_ID_HEADER: "m1"}
    async with replica.post("/v1/invoke", data=b"{}", headers=sent) as response:
        assert response.status == 200, await response.text()
        echoed = await response.json()
    names = {name for name, _ in echoed["headers"]}
    assert not any(name.startswith("x-modelplex-") for name in names - {"x-modelplex-on-cold"})
    assert TOKEN not in json.dumps(echoed)
    assert {"cookie", "authorization", "x-modelplex-on-cold", MODEL_ID_HEADER} <= names
    # What the router said still applies: the client's method and path.
    assert (echoed["method"], echoed["path"]) == ("PUT", "/items/a/b")


async def test_a_request_without_the_credential_never_reaches_the_app(replica):
    async with replica.post("/v1/invoke", data=b"{}", headers={METHOD_HEADER: "GET", PATH_HEADER: "/"}) as response:
        assert response.status == 401


# -- behind a Gateway: the Endpoint Picker's proof instead of the credential ---------------------


def _address(client: TestClient) -> str:
    return f"127.0.0.1:{client.port}"


async def _invoke(client: TestClient, model: str, proof: str) -> tuple[int, str]:
    async with client.post("/v1/invoke", data=b"{}", headers={MODEL_ID_HEADER: model, PROOF_HEADER: proof}) as answer:
        return answer.status, await answer.text()


async def test_a_proof_for_the_model_and_this_replica_is_taken_and_user_code_never_sees_it(replica):
    proof = make_proof(TOKEN, "m1", _address(replica), time.time())
    status, text = await _invoke(replica, "m1", proof)
    assert status == 200, text
    names = {name for name, _ in json.loads(text)["headers"]}
    assert PROOF_HEADER.lower() not in names and proof not in text


async def test_a_proof_for_another_model_replica_or_an_expired_one_gets_401(replica):
    now = time.time()
    for model, proof in (("m2", make_proof(TOKEN, "m1", _address(replica), now)),
                         ("m1", make_proof(TOKEN, "m1", "127.0.0.1:1", now)),
                         ("m1", make_proof(TOKEN, "m1", _address(replica), now - 60)),
                         ("m1", make_proof("not-the-credential", "m1", _address(replica), now))):
        status, text = await _invoke(replica, model, proof)
        assert status == 401, text
        assert json.loads(text)["error"]["code"] == "unauthorized"


async def test_a_proof_opens_no_route_but_inference_and_metadata(replica):
    proof = make_proof(TOKEN, "m1", _address(replica), time.time())
    for method, path in (("POST", "/v1/models/m1/load"), ("DELETE", "/v1/models/m1"), ("GET", "/v1/models")):
        async with replica.request(method, path, headers={MODEL_ID_HEADER: "m1", PROOF_HEADER: proof}) as answer:
            assert answer.status == 401, (method, path, await answer.text())


# -- a Starlette request (spec.http.request: starlette), as Ray Serve hands one to __call__ -------


class StarletteEcho:
    async def __call__(self, request):
        return {"headers": list(request.headers.items()), "body": (await request.json())}


STARLETTE_DEPLOYMENT = parse_deployment({
    "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "echo"},
    "spec": {"image": "x", "handler": "m:StarletteEcho", "http": {"request": "starlette"}}})


async def test_a_starlette_request_has_the_clients_headers_and_no_internal_one(tmp_path):
    internal = TokenFile(write_token_file(tmp_path / "internal", TOKEN))
    app = create_app(STARLETTE_DEPLOYMENT, StarletteEcho(), internal=internal)
    sent = {INTERNAL_TOKEN_HEADER: TOKEN, METHOD_HEADER: "POST", PATH_HEADER: "/echo", "X-Modelplex-Anything": "x",
            "x-modelplex-on-cold": "reject", "Cookie": "session=1", MODEL_ID_HEADER: "m1",
            "Content-Type": "application/json"}
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        async with client.post("/v1/invoke", data=b'{"x": 1}', headers=sent) as response:
            assert response.status == 200, await response.text()
            echoed = await response.json()
    names = {name for name, _ in echoed["headers"]}
    assert {"cookie", "x-modelplex-on-cold", MODEL_ID_HEADER} <= names
    assert not any(name.startswith("x-modelplex-") for name in names - {"x-modelplex-on-cold"})
    assert TOKEN not in json.dumps(echoed) and echoed["body"] == {"x": 1}
