"""A Kubernetes API server's HTTP shape on loopback, for the operator's client-side unit tests.

It runs no cluster: each request gets the next scripted answer, else what an empty cluster that
accepts every write would say. The client under test is the real ``kubernetes`` client, over
real HTTP; the e2e suite runs the real API server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from modelplex_operator.kube import Kube


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: Any


class ScriptedApiServer(ThreadingHTTPServer):
    """``answers``: (status, message) for the next requests, in order (a dict instead of the
    message is the answer's whole document); once they are used up a
    GET is 404 and a write (PATCH, POST, PUT) is 200 with the object it sent, a DELETE 200.
    ``unknown``: resources (plurals) the server does not serve, as without their CRD: every
    request for them is 404; ``objects``: what a GET of a path (without its query) answers
    once the scripted answers are used up. ``requests``: every request, in order."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: list[tuple[int, str | dict]] = []
        self.requests: list[Request] = []
        self.unknown: set[str] = set()
        self.objects: dict[str, dict] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def reset(self) -> None:
        self.answers, self.requests = [], []
        self.unknown = set()
        self.objects = {}

    def kube(self, timeout: float = 5.0) -> Kube:
        """The operator's client, pointed here."""
        return kube_at(self.url, timeout)

    def writes(self) -> list[Request]:
        return [request for request in self.requests if request.method != "GET"]


def kube_at(url: str, timeout: float = 5.0) -> Kube:
    configuration = client.Configuration(host=url)
    configuration.retries = 0  # one try: the operator retries through kopf, with its own backoff
    return Kube(client.ApiClient(configuration), timeout=timeout)


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedApiServer

    def _answer(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        sent = json.loads(raw) if raw else None
        self.server.requests.append(Request(self.command, self.path, sent))
        name = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if set(self.path.split("?", 1)[0].split("/")) & self.server.unknown:
            status, message = 404, "the server could not find the requested resource"
        elif self.server.answers:
            status, message = self.server.answers.pop(0)
        elif self.command == "GET" and self.path.split("?", 1)[0] in self.server.objects:
            status, message = 200, self.server.objects[self.path.split("?", 1)[0]]
        else:
            status, message = (404, f"{name} not found") if self.command == "GET" else (200, "")
        if isinstance(message, dict):  # a scripted document (a GET's object or list)
            document = message
        elif status >= 300:
            document = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                        "reason": f"Reason{status}", "code": status}
        else:
            document = dict(sent or {"kind": "Object"})
            document["metadata"] = {"name": name, **(document.get("metadata") or {}), "resourceVersion": "1"}
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


@contextmanager
def scripted_api_server() -> Iterator[ScriptedApiServer]:
    server = ScriptedApiServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
