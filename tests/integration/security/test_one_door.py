"""One door, one decision, in local mode (README, "Security"): model control, a tenant's globs, the
load quota, ``onCold`` and the logs act on the one model id a request is served with, through
every front (HTTP, OIP REST, gRPC with tritonclient); internal headers and the credential the
router read never reach user code; a scoped client lists only its models; client-made ids never
become metric series. Each seen by an outsider (no credential) and by a scoped tenant."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from support.servers import Processes
from support.stacks import Stack, manifest, start_local, write_documents

HERE = Path(__file__).resolve().parent
MODEL = "serve_multiplexed_model_id"
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789",
          "carol": "carol-token-0123456789", "dave": "dave-token-0123456789"}
#: Each client's cold loads (guarded, cold): a bucket that does not refill within a test run.
QUOTA = {"loadsPerMinute": 0.01, "burst": 3}
WAIT_S = 120.0
ACCESS_LINE = re.compile(r'modelplex\.access: (\{"time".*\})$', flags=re.M)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request) -> Stack:
    """``guarded``: router auth (bob may call ``public-*`` only, carol ``c-*``), a load quota, the
    model label on; ``cold``: no auth, a load quota by address, ``onCold: reject`` for ``r-*``;
    ``app``: a ``serve.ingress`` app behind router auth that echoes what it is given."""
    processes = Processes(tmp_path_factory.mktemp("door"))
    request.addfinalizer(processes.stop_all)
    shutil.copy(HERE / "door_handlers.py", processes.folder / "door_handlers.py")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "door-clients"}, "stringData": TOKENS}
    auth = {"secretRef": {"name": "door-clients"}, "models": {"bob": ["public-*"], "carol": ["c-*"]}}
    documents = [
        secret,
        manifest("guarded", "door_handlers:Served", router={"auth": auth, "loadQuota": QUOTA},
                 metrics={"modelLabel": True}),
        manifest("cold", "door_handlers:Served", router={"loadQuota": QUOTA},
                 models=[{"match": "r-*", "onCold": "reject"}]),
        manifest("app", "door_handlers:Echo", router={"auth": auth}),
    ]
    path = write_documents(processes.folder / "door.yaml", documents)
    try:
        return start_local(processes, path, deployments=3)
    except BaseException:
        print(processes.report())  # what the processes said, for the failure
        raise


def bearer(client: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[client]}"}


def grpc_bearer(client: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[client]}"}


async def index(session: aiohttp.ClientSession, router: str, headers: dict | None = None) -> dict[str, str]:
    async with session.post(router + "/v2/repository/index", headers=headers) as response:
        assert response.status == 200, await response.text()
        return {entry["name"]: entry["state"] for entry in await response.json()}


async def served(session: aiohttp.ClientSession, router: str, model: str, headers: dict) -> str:
    async with session.post(router + "/", json={}, headers={MODEL: model, **headers}) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["served"]


def access_lines(stack: Stack) -> list[dict]:
    """The access log's lines so far (every router's output is in local mode's)."""
    return [json.loads(found) for found in ACCESS_LINE.findall(stack.proc.log.read_text())]


async def audited(stack: Stack, path: str, count: int) -> list[dict]:
    """The access lines of ``path``, once ``count`` of them are written (the log is a pipe away)."""
    for _ in range(100):
        lines = [line for line in access_lines(stack) if line["path"] == path]
        if len(lines) >= count:
            return lines
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} access lines for {path} expected; got {access_lines(stack)}")


def ones() -> triton.InferInput:
    tensor = triton.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    return tensor


def grpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        call()
    return raised.value


# -- 1. model control, whatever the id's encoding --------------------------------------------------


async def test_model_control_stays_off_for_an_id_with_a_slash_on_every_front_and_every_try_is_audited(stack):
    router = stack.url("guarded")
    async with aiohttp.ClientSession() as session:
        assert await served(session, router, "org/name", bearer("alice")) == "org/name"
        for headers in ({}, bearer("bob"), bearer("alice")):  # an outsider, a scoped tenant, a full client
            for action in ("unload", "load"):
                async with session.post(router + f"/v2/repository/models/org%2Fname/{action}",
                                        headers=headers) as response:
                    assert response.status == 403, await response.text()
                    assert "spec.router.modelControl" in (await response.json())["error"]
        with triton.InferenceServerClient(stack.grpc["guarded"]) as client:
            for headers in (None, grpc_bearer("bob")):
                for call in (client.unload_model, client.load_model):
                    error = grpc_error(lambda: call("org/name", headers=headers))
                    assert error.status() == "StatusCode.PERMISSION_DENIED"
        assert (await index(session, router, bearer("alice"))).get("org/name") == "READY"  # still loaded
        lines = await audited(stack, "/v2/repository/models/org/name/unload", 3)
        assert {line["status"] for line in lines} == {403} and {line["model"] for line in lines} == {"org/name"}
        assert len(await audited(stack, "/v2/repository/models/org%2Fname/unload", 2)) >= 2  # the gRPC tries
    assert not any(token in stack.proc.log.read_text() for token in TOKENS.values())


# -- 2. a tenant's globs: the id in the path is the one served --------------------------------------


async def test_a_model_id_header_that_differs_from_the_path_is_refused_on_every_front(stack):
    router = stack.url("guarded")
    async with aiohttp.ClientSession() as session:
        for headers in ({}, bearer("bob")):
            for spelling in (MODEL, "serve-multiplexed-model-id"):
                async with session.post(router + "/v1/models/public-1/predict", json={},
                                        headers={spelling: "private-b", **headers}) as response:
                    assert response.status == 400, await response.text()
                    assert "'private-b'" in (await response.json())["error"]["message"]
            async with session.post(router + "/v2/models/public-1/infer", headers={MODEL: "private-b", **headers},
                                    json={"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
                                    ) as response:
                assert response.status == 400
        async with session.post(router + "/v1/models/public-1/predict", json={}, headers=bob_same()) as response:
            assert response.status == 200 and (await response.json())["served"] == "public-1"
        async with session.post(router + "/v1/models/public-1/predict", json={}, headers=bearer("bob")) as response:
            assert (await response.json())["served"] == "public-1"
        assert "private-b" not in await index(session, router, bearer("alice"))  # nothing loaded it
    with triton.InferenceServerClient(stack.grpc["guarded"]) as client:
        error = grpc_error(lambda: client.infer("public-1", [ones()], client_timeout=WAIT_S,
                                                headers={MODEL: "private-b", **grpc_bearer("bob")}))
        assert error.status() == "StatusCode.INVALID_ARGUMENT" and "'private-b'" in error.message()


def bob_same() -> dict[str, str]:
    """bob's header naming the path's own model: allowed, it says the same."""
    return {MODEL: "public-1", **bearer("bob")}


# -- 4. every route that can load a model passes the quota and onCold -------------------------------


async def test_an_outsider_with_its_loads_spent_cannot_load_through_metadata_or_ready_on_any_front(stack):
    router = stack.url("cold")
    async with aiohttp.ClientSession() as session:
        async with session.get(router + "/v2/models/r-1") as response:  # onCold: reject, takes a load
            assert response.status == 503 and (await response.json())["error"]
            assert response.headers["Retry-After"]
        with triton.InferenceServerClient(stack.grpc["cold"]) as client:
            error = grpc_error(lambda: client.get_model_metadata("r-2"))  # the same over gRPC
            assert error.status() == "StatusCode.UNAVAILABLE"
            assert await served(session, router, "q-1", {}) == "q-1"  # the third and last load
            for path in ("/v2/models/q-2", "/v2/models/q-2/ready"):
                async with session.get(router + path) as response:
                    assert response.status == 429, (path, await response.text())
            for call in (lambda: client.get_model_metadata("q-3"), lambda: client.is_model_ready("q-3")):
                assert grpc_error(call).status() == "StatusCode.RESOURCE_EXHAUSTED"
        states = await index(session, router)  # (r-1 and r-2 load in the background: onCold's retry finds them)
        assert "q-2" not in states and "q-3" not in states


async def test_a_scoped_tenant_with_its_loads_spent_cannot_load_through_metadata_or_ready_on_any_front(stack):
    router = stack.url("guarded")
    carol = bearer("carol")
    async with aiohttp.ClientSession() as session:
        for model in ("c-1", "c-2", "c-3"):
            assert await served(session, router, model, carol) == model
        for path in ("/v2/models/c-4", "/v2/models/c-4/ready"):
            async with session.get(router + path, headers=carol) as response:
                assert response.status == 429, (path, await response.text())
        with triton.InferenceServerClient(stack.grpc["guarded"]) as client:
            for call in (lambda: client.get_model_metadata("c-5", headers=grpc_bearer("carol")),
                         lambda: client.is_model_ready("c-5", headers=grpc_bearer("carol"))):
                assert grpc_error(call).status() == "StatusCode.RESOURCE_EXHAUSTED"
        states = await index(session, router, bearer("alice"))
        assert "c-4" not in states and "c-5" not in states


# -- 6. what a scoped client sees --------------------------------------------------------------------


async def test_a_scoped_client_lists_only_the_models_its_globs_allow_on_every_front(stack):
    router = stack.url("guarded")
    async with aiohttp.ClientSession() as session:
        await served(session, router, "private-1", bearer("alice"))
        await served(session, router, "public-2", bearer("bob"))
        assert "private-1" in await index(session, router, bearer("alice"))
        seen = await index(session, router, bearer("bob"))
        assert "public-2" in seen and all(model.startswith("public-") for model in seen)
        async with session.post(router + "/v2/repository/index") as response:
            assert response.status == 401  # an outsider lists nothing
    with triton.InferenceServerClient(stack.grpc["guarded"]) as client:
        listed = [model["name"] for model in
                  client.get_model_repository_index(headers=grpc_bearer("bob"), as_json=True)["models"]]
        assert "public-2" in listed and all(model.startswith("public-") for model in listed)
        assert grpc_error(lambda: client.get_model_repository_index()).status() == "StatusCode.UNAUTHENTICATED"


async def test_ids_no_replica_has_loaded_never_become_series_of_their_own(stack):
    router = stack.url("guarded")
    async with aiohttp.ClientSession() as session:
        await served(session, router, "m-real", bearer("dave"))
        for number in range(30):
            async with session.post(router + "/", json={}, headers={MODEL: f"bogus-{number}", **bearer("dave")}):
                pass
        base = stack.control_url("guarded") if "guarded" in stack.control else router
        async with session.get(base + "/metrics") as response:
            page = await response.text()
    assert 'model="m-real"' in page and 'model="other"' in page
    assert "bogus-" not in page


# -- 3. internal headers and the router's own credential stay out of user code ----------------------


async def test_an_ingress_app_sees_the_clients_request_without_internal_headers_or_the_routers_token(stack):
    router = stack.url("app")
    async with aiohttp.ClientSession() as session:
        sent = {**bearer("alice"), "Cookie": "session=1", "X-Modelplex-Internal-Token": "a guess",
                "X-Modelplex-Protocol": "oip-v2", "X-Request-Id": "r-1"}
        async with session.get(router + f"/items?x=1&access_token={TOKENS['bob']}", headers=sent) as response:
            assert response.status == 200, await response.text()
            echoed = await response.json()
        async with session.get(router + f"/items?access_token={TOKENS['alice']}") as response:
            assert response.status == 200, await response.text()
            by_param = await response.json()
        async with session.get(router + "/items") as response:
            assert response.status == 401  # an outsider reaches no app
    headers = {name: value for name, value in echoed["headers"]}
    assert not [name for name in headers if name.startswith("x-modelplex-")]
    assert "authorization" not in headers and headers["cookie"] == "session=1" and headers["x-request-id"] == "r-1"
    assert echoed["query"] == "x=1" and by_param["query"] == ""
    for answer in (echoed, by_param):
        assert not any(token in json.dumps(answer) for token in TOKENS.values())
