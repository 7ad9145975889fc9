"""The server's reach into aiohttp's private parts (modelplex/serving.py): each one is checked
here, by kind and by effect, so that a new aiohttp that moves one fails this test before it
breaks a server. pyproject.toml holds aiohttp to the minor version this passes on."""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from modelplex.serving import JsonErrorProtocol, JsonErrorRunner, freeze_startup_objects


def test_the_private_aiohttp_methods_and_slots_the_server_overrides_or_sets_are_there():
    # JsonErrorRunner overrides AppRunner._make_server (a coroutine making the app's Server).
    assert inspect.iscoroutinefunction(vars(web.AppRunner)["_make_server"])
    # serve() sets the runner's _shutdown_timeout (a slot of BaseRunner) before cleanup.
    assert "_shutdown_timeout" in web.BaseRunner.__slots__
    # JsonErrorProtocol overrides handle_error with these parameters.
    parameters = list(inspect.signature(RequestHandler.handle_error).parameters)
    assert parameters == ["self", "request", "status", "exc", "message"]
    # A Server is its own protocol factory (a connection's protocol is what calling it gives).
    assert callable(vars(web.Server)["__call__"])


async def test_the_servers_loop_and_kwargs_make_the_json_error_protocol():
    app = web.Application()
    runner = JsonErrorRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=7.5)
    await runner.setup()
    try:
        assert runner._shutdown_timeout == 7.5  # the constructor's value lives in the slot serve() sets
        server = runner.server
        assert server is not None
        assert server._loop is asyncio.get_running_loop()
        assert isinstance(server._kwargs, dict) and server._kwargs.get("access_log", "unset") is None
        protocol = server.protocol()
        assert type(protocol) is JsonErrorProtocol and isinstance(protocol, RequestHandler)
    finally:
        await runner.cleanup()


async def test_a_shutdown_timeout_set_after_start_is_the_grace_cleanup_gives_open_requests():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def forever(request: web.Request) -> web.Response:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response()  # never reached

    app = web.Application()
    app.router.add_get("/", forever)
    # A grace of an hour at start: only the value set later can end the request in time.
    runner = JsonErrorRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=3600)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.get(url))
        try:
            await asyncio.wait_for(started.wait(), 30)
            runner._shutdown_timeout = 0.5  # > 0: aiohttp reads 0 as "no bound"
            await asyncio.wait_for(runner.cleanup(), 60)
            assert cancelled.is_set()
        finally:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)


class _Node:
    def __init__(self):
        self.other = self


def test_start_up_garbage_is_collected_and_what_lives_is_frozen_out_of_later_collections():
    garbage, living = _Node(), _Node()
    gone = weakref.ref(garbage)
    del garbage  # a cycle: only the collector frees it
    gc.disable()  # nothing but the call under test may collect it
    try:
        freeze_startup_objects()
        assert gone() is None
        assert gc.get_freeze_count() > 0
        assert not any(o is living for o in gc.get_objects())  # the three generations: not the frozen
    finally:
        gc.unfreeze()
        gc.enable()
