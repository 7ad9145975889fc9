"""``serve.run`` and ``serve.shutdown`` from the calling process: handles by either name, streams, a clear
error when the port is taken, nothing left running after shutdown."""

from __future__ import annotations

import os
import socket

import pytest

from modelplex import handle, serve

from support.stacks import consecutive_free_ports


@serve.deployment(num_replicas=2)
class WordCounter:
    def __init__(self, unit: str):
        self.unit = unit

    def count(self, text: str) -> str:
        return f"{len(text.split())} {self.unit}"

    def words(self, text: str):
        for word in text.split():
            yield word.upper()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_run_answers_by_either_name_and_shutdown_stops_every_process():
    port = consecutive_free_ports(1)
    ingress = serve.run(WordCounter.bind("words"), _port=port)
    try:
        assert ingress.url == serve.running._apps["default"].urls["word-counter"]  # its router, not the shared port
        assert ingress.count.remote("one two three").result(60) == "3 words"
        assert serve.get_deployment_handle("WordCounter").count.remote("a b").result(60) == "2 words"
        assert handle("word-counter").count.remote("a").result(60) == "1 words"
        assert handle("WordCounter").count.remote("").result(60) == "0 words"
        assert list(ingress.options(stream=True).words.remote("to be or not")) == ["TO", "BE", "OR", "NOT"]
        local = serve.running._apps["default"].running.proc.pid
    finally:
        serve.shutdown()
    assert not _alive(local)
    with pytest.raises(LookupError):
        handle("word-counter")  # its router is gone, and so is its name


def test_a_port_in_use_is_a_clear_error_and_nothing_is_left_running():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(OSError, match=r"cannot listen on 127.0.0.1:\d+ \(set MODELPLEX_SERVE_HTTP_PORT"):
            serve.run(WordCounter.bind("words"), _port=held.getsockname()[1])
    assert serve.running._apps == {} and serve.running._front is None
