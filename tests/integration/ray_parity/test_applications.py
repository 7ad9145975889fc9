"""Several applications side by side, as Ray's multi-application tests run them
(``python/ray/serve/tests/test_multiplex.py``'s neighbours ``test_deploy_app.py`` and
``test_api.py``): ``serve.run(app, name=..., route_prefix=...)`` adds or updates one
application and leaves the others serving, on one HTTP port told apart by route prefix;
``serve.status()`` lists them, ``serve.delete`` removes one; deployment names are scoped per
application; a second ``serve.run`` in the same event loop loses no call (issue 31, items 1 and 2)."""

from __future__ import annotations

import sys

import aiohttp
import cloudpickle
import pytest
from starlette.requests import Request

from modelplex import serve
from modelplex.handles import DeploymentHandle

from support.stacks import consecutive_free_ports

# Shipped to the replicas by value, as a script's classes are (tests/ is not on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@serve.deployment
class DecodeVideo:
    """Named alike in both applications: each application's handle must reach its own."""

    def __init__(self, codec: str):
        self.codec = codec

    def __call__(self) -> str:
        return self.codec


@serve.deployment
class Orchestrator:
    def __init__(self, decode: DeploymentHandle, name: str):
        self.decode = decode
        self.name = name

    async def __call__(self, body) -> str:
        return f"{self.name}: {await self.decode.remote()}"


@serve.deployment
class Echo:
    def __init__(self, tag: str):
        self.tag = tag

    async def __call__(self, body) -> str:
        if isinstance(body, Request):  # over HTTP: Ray's Starlette request; through a handle: the value
            body = await body.json()
        return f"{self.tag} {body}"


def video_app(name: str, codec: str):
    return Orchestrator.bind(DecodeVideo.bind(codec), name)


@pytest.fixture
def port():
    port = consecutive_free_ports(1)
    try:
        yield port
    finally:
        serve.shutdown()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client


async def text(session, url, body=None):
    async with session.post(url, json=body if body is not None else {}) as response:
        return response.status, await response.text()


async def test_two_applications_serve_side_by_side_on_one_port_until_one_is_deleted(port, session):
    """Issue 31, item 2: the second application replaced the first ("this deployment answers under /b")."""
    base = f"http://127.0.0.1:{port}"
    serve.run(video_app("video_a", "h264"), name="app_a", route_prefix="/a", _port=port)
    serve.run(video_app("video_b", "vp9"), name="app_b", route_prefix="/b", _port=port)
    assert await text(session, base + "/a") == (200, "video_a: h264")
    assert await text(session, base + "/b/sub/path") == (200, "video_b: vp9")
    status, body = await text(session, base + "/c")
    assert status == 404 and "/a, /b" in body

    applications = serve.status().applications
    assert set(applications) == {"app_a", "app_b"}
    assert applications["app_a"].status == "RUNNING" and applications["app_a"].route_prefix == "/a"
    # Ray's deployment names, each with its live replicas (issue 40, item 4).
    assert {name: deployment.replica_states for name, deployment in applications["app_b"].deployments.items()} == \
        {"Orchestrator": {"RUNNING": 1}, "DecodeVideo": {"RUNNING": 1}}
    # Deployment names are scoped per application: both have a decode-video, each its own.
    assert await serve.get_deployment_handle("DecodeVideo", app_name="app_a").remote() == "h264"
    assert await serve.get_deployment_handle("decode-video", app_name="app_b").remote() == "vp9"

    serve.delete("app_a")
    assert set(serve.status().applications) == {"app_b"}
    assert (await text(session, base + "/a"))[0] == 404
    assert await text(session, base + "/b") == (200, "video_b: vp9")


async def test_a_route_prefix_another_application_uses_is_refused_and_it_keeps_serving(port, session):
    serve.run(Echo.bind("first"), name="first", route_prefix="/echo", _port=port)
    with pytest.raises(ValueError, match='Prefix /echo is being used by application "first". '
                                         'Failed to deploy application "second".'):
        serve.run(Echo.bind("second"), name="second", route_prefix="/echo", _port=port)
    assert await text(session, f"http://127.0.0.1:{port}/echo", "hi") == (200, "first hi")
    assert set(serve.status().applications) == {"first"}


async def test_a_second_run_in_the_same_loop_updates_the_application_and_loses_no_call(port, session):
    """Issue 31, item 1: `h = serve.run(A.bind()); await h.remote(1); h = serve.run(B.bind());
    await h.remote(1)` failed with "Can not write request body" (a pooled connection to the
    router the second run replaced); a handle from before the update follows it."""
    h = serve.run(Echo.bind("A"), _port=port)
    assert await h.remote(1) == "A 1"
    old = h
    h = serve.run(Echo.bind("B"), _port=port)  # the same application, "default": updated
    assert await h.remote(1) == "B 1"
    assert await old.remote(2) == "B 2"
    assert list(serve.status().applications) == ["default"]
    assert await text(session, f"http://127.0.0.1:{port}/", 3) == (200, "B 3")
    # Another application beside it, without an HTTP route: the first keeps serving.
    other = serve.run(Echo.bind("C"), name="other", route_prefix=None, _port=port)
    assert await other.remote(4) == "C 4"
    assert await h.remote(5) == "B 5"
    assert serve.status().applications["other"].route_prefix is None
