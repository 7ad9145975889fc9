"""Replica fixtures: a manifest beside a copy of probe.py, served by a real replica process; a
real HTTP model store on loopback that decodes paths as nginx does and logs what it served."""

from __future__ import annotations

import posixpath
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import unquote, urlsplit

import pytest

from support.manifests import manifest_writer
from support.servers import free_port

HERE = Path(__file__).resolve().parent


@pytest.fixture
def manifest(tmp_path: Path) -> Callable[..., Path]:
    """Write a manifest for ``spec`` (merged over a Probe handler default) and return its path."""
    return manifest_writer(tmp_path, HERE / "probe.py", "probe:Probe")


@dataclass(frozen=True)
class Fetch:
    target: str  # the request target as it came on the wire
    path: str  # decoded and normalised: what the store served
    query: str
    headers: dict[str, str]
    status: int


@dataclass
class Store:
    root: Path
    url: str = ""
    fetches: list[Fetch] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Store:
        store = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                split = urlsplit(self.path)
                path = posixpath.normpath(unquote(split.path))  # nginx: decode, then merge slashes/dots
                file = store.root / path.removeprefix("/store/") if path.startswith("/store/") else None
                status = 200 if file is not None and file.is_file() else 404
                store.fetches.append(Fetch(self.path, path, split.query, dict(self.headers.items()), status))
                body = file.read_bytes() if status == 200 else b"not found"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An nginx-like model store (see :class:`Store`) serving ``tmp_path/store-root`` at ``/store/``."""
    root = tmp_path / "store-root"
    root.mkdir()
    running = Store(root).start()
    try:
        yield running
    finally:
        running.stop()
