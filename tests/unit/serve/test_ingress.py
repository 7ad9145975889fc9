"""``@serve.ingress``: a FastAPI app's routes that are methods get the deployment's instance as
``self``; the rest of the app is left as it is (the app is driven here as an ASGI server would)."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI

from modelplex import serve
from modelplex.serve.ingress import asgi_app, current_instance


async def call(app, method: str, path: str, query: str = "", body: bytes = b"") -> tuple[int, object]:
    """One request through ``app``: (status, JSON body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "root_path": "", "headers": [(b"content-type", b"application/json")], "client": None,
             "server": ("test", 80)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def greeter_app() -> tuple[FastAPI, type]:
    app = FastAPI()

    @app.get("/function/{x}")
    def function_route(x: int):
        return {"x": x}

    @serve.ingress(app)
    class Greeter:
        def __init__(self, greeting: str):
            self.greeting = greeting

        @app.post("/hello")
        async def hello(self, name: str, times: int = 1) -> str:
            return " ".join([f"{self.greeting} {name}"] * times)

        @app.get("/count")
        def count(self) -> int:  # a plain def: FastAPI's thread pool, the instance still its self
            return len(self.greeting)

    return app, Greeter


async def test_a_method_route_gets_the_serving_instance_as_self_and_its_other_parameters_from_the_request():
    app, greeter = greeter_app()
    token = current_instance.set(greeter("hi"))
    try:
        assert await call(app, "POST", "/hello", "name=ann&times=2") == (200, "hi ann hi ann")
        assert await call(app, "GET", "/count") == (200, 2)
        assert await call(app, "GET", "/function/7") == (200, {"x": 7})
        status, error = await call(app, "POST", "/hello", "times=2")  # name is required
        assert status == 422 and error["detail"][0]["loc"] == ["query", "name"]
    finally:
        current_instance.reset(token)


async def test_self_is_not_a_query_parameter_in_the_openapi_document():
    app, _ = greeter_app()
    status, document = await call(app, "GET", "/openapi.json")
    parameters = document["paths"]["/hello"]["post"]["parameters"]
    assert status == 200 and [p["name"] for p in parameters] == ["name", "times"]


async def test_a_method_route_outside_a_replica_is_a_clear_error():
    app, _ = greeter_app()
    with pytest.raises(RuntimeError, match="runs only in the deployment's replica"):
        await call(app, "GET", "/count")


def test_the_class_keeps_its_methods_for_handles_and_carries_its_app():
    app, greeter = greeter_app()
    instance = greeter("hi")
    assert asgi_app(instance) is app
    assert instance.count() == 2
    with pytest.raises(TypeError, match="call its methods by name through a handle"):
        instance()


def test_ingress_goes_below_deployment_and_takes_an_app():
    app = FastAPI()
    with pytest.raises(TypeError, match=r"put it below @serve.deployment"):
        @serve.ingress(app)
        @serve.deployment
        class Wrong:
            pass
    with pytest.raises(TypeError, match="takes an ASGI app"):
        serve.ingress("not an app")
