"""Handles as Ray users' code drives them (issue 31): Ray's private routing hint, a router that
``serve.run`` replaced while the caller's loop held connections to it, and a script's end.

The deployments are stand-ins on loopback (real aiohttp servers answering the handle's calls);
``serve.run`` itself is driven in tests/integration/ray_parity/test_applications.py."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import threading

import pytest
from aiohttp import web

from modelplex import handles
from modelplex.handles import forget_routers, handle, router_moved
from modelplex.processes import free_ports
from modelplex.wire.codec import VALUE_CONTENT_TYPE, decode_call, encode_value


class Router:
    """A stand-in router on a fixed loopback port: answers each call with (its tag, the argument)."""

    def __init__(self, port: int, tag: str):
        self.port, self.tag = port, tag
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Router:
        async def invoke(request: web.Request) -> web.Response:
            call = decode_call(await request.read())
            return web.Response(body=encode_value([self.tag, call.args[0]]), content_type=VALUE_CONTENT_TYPE)

        app = web.Application()
        app.router.add_post("/", invoke)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()


@pytest.fixture
def port() -> int:
    return free_ports(1)[0]


async def test_options_accepts_prefer_local_routing_and_ignores_it_with_a_debug_line(caplog):
    """The documents' prose passes it (`handle.options(stream=True, _prefer_local_routing=True)`)."""
    caplog.set_level(logging.DEBUG, "modelplex.handles")
    h = handle("app", url="http://127.0.0.1:9").options(stream=True, _prefer_local_routing=True)
    assert h.stream
    assert "_prefer_local_routing=True ignored" in caplog.text


class Elsewhere:
    """An event loop in a thread of its own, where the stand-in routers run: stopping one there
    while the test's loop is blocked (as ``serve.run`` blocks it) leaves the test's pooled
    connection unaware that it is closed, as a router process's end does."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


async def test_a_second_run_in_the_same_loop_does_not_lose_the_next_call(port):
    """Issue 31, item 1: the loop's pooled connection to the replaced router was dead, and the
    first call after the re-run failed ("Can not write request body")."""
    elsewhere = Elsewhere()
    try:
        first = elsewhere.run(Router(port, "A").start())
        h = handle("app", url=first.url)
        assert await h.remote(1) == ["A", 1]
        # serve.run replaces the application while this loop waits for it: a new router on the same port.
        elsewhere.run(first.stop())
        second = elsewhere.run(Router(port, "B").start())
        forget_routers([first.url])  # what serve.run does when it replaces a router
        assert await h.remote(1) == ["B", 1]
        assert await h.remote(2) == ["B", 2]
        elsewhere.run(second.stop())
    finally:
        elsewhere.close()


async def test_a_call_refused_while_its_router_restarts_is_sent_once_it_is_back(port, monkeypatch):
    """A refused connection sent nothing: the call is tried once more, and answered once."""
    monkeypatch.setattr(handles, "RETRY_AFTER_S", 3.0)
    h = handle("app", url=f"http://127.0.0.1:{port}")
    call = asyncio.ensure_future(h.remote(7))
    await asyncio.sleep(1.0)  # the first try was refused: nothing listens yet
    assert not call.done()
    router = await Router(port, "back").start()
    try:
        assert await asyncio.wait_for(call, 30) == ["back", 7]
    finally:
        await router.stop()


async def test_a_handle_follows_its_router_to_a_new_address(port):
    router = await Router(port, "moved").start()
    old = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there any more
    router_moved(old, router.url)
    try:
        assert await handle("app", url=old).remote(3) == ["moved", 3]
    finally:
        await router.stop()
        handles._moved.pop(old, None)


def test_a_script_that_used_handles_ends_without_unclosed_session_warnings(tmp_path, port):
    """Issue 31, item 6: 10 of 18 example runs ended with aiohttp's "Unclosed client session"
    and "Unclosed connector" (a loop's pooled connections, and the background loop's)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, gc, threading
        from aiohttp import web
        from modelplex import handle, handles
        from modelplex.wire.codec import VALUE_CONTENT_TYPE, encode_value

        async def invoke(request):
            return web.Response(body=encode_value("ok"), content_type=VALUE_CONTENT_TYPE)

        def serve(ready):
            async def main():
                app = web.Application()
                app.router.add_post("/", invoke)
                runner = web.AppRunner(app)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", {port}).start()
                ready.set()
                await asyncio.Event().wait()
            asyncio.run(main())

        ready = threading.Event()
        threading.Thread(target=serve, args=(ready,), daemon=True).start()
        ready.wait(30)
        h = handle("app", url="http://127.0.0.1:{port}")

        async def main():
            assert await h.remote() == "ok"
            assert await h.options(stream=False).remote() == "ok"

        def still_open():
            return [session for pool in list(handles._sessions.values()) for session in pool.values()
                    if not session.closed]

        asyncio.run(main())          # a loop's own pool: closed as the loop ends
        assert not still_open()
        assert h.remote().result() == "ok"   # the background loop's, outside any loop
        asyncio.run(main())          # a second loop, as a notebook's cells or a second run
        assert len(still_open()) == 1  # the background loop's, until the exit closes it
        handles._background.close()  # what the exit does
        assert not still_open()
        gc.collect()
        print("done")
    """))
    done = subprocess.run([sys.executable, "-X", "dev", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout
    assert "Unclosed" not in done.stderr, done.stderr
