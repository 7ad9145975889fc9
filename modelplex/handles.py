"""Handles: call another deployment through its router, as Ray Serve's DeploymentHandle does.

    detect = modelplex.handle("detect").options(multiplexed_model_id="faces-v2")
    boxes = await detect.remote(frame)                         # __call__(frame)
    boxes = await detect.predict.remote(frame, threshold=0.5)  # a method by name
    responses = [model.run.remote(i) for i in range(8)]       # all eight are sent at once
    async for chunk in decode.options(stream=True).remote(video):   # a stream of items
        ...

``.remote()`` sends at once, with or without a running event loop, and returns a
:class:`DeploymentResponse`: await it in any loop, or call ``.result()`` outside one. A call
made in an event loop runs there (no thread hop); one made where no loop runs goes to a
background loop thread; either is awaitable from anywhere. A response passed as an argument
to another call is awaited first; so is a reference from Ray's ``_to_object_ref()`` or
``_to_object_ref_gen()`` (:class:`ObjectRef`: the value itself, there being no object store).

Arguments and results keep their Python types (:mod:`modelplex.wire.codec`: str, bytes, None,
tuples, sets, numpy arrays, tensors); an exception raised by the deployment's code arrives
with its type name and message (a built-in type is raised as itself: ``except ValueError``
works), other failures as the :mod:`modelplex.wire.errors` class of their HTTP answer.

Calls go through the deployment's router, so routing stays cache-aware and the model id
travels in the ``serve_multiplexed_model_id`` header. A handle resolves a deployment name to
its router: ``MODELPLEX_ROUTER_<NAME>`` when set (``modelplex local`` sets it for every
deployment it runs), else the deployment's Service in the pod's namespace
(``http://<name>.<POD_NAMESPACE>.svc:8000``).

Streams are pulled: an item is read from the socket only when the consumer asks for the
next one, so a slow consumer slows the producer (TCP backpressure) and nothing buffers
without bound. Closing the stream, or cancelling the awaiting task, closes the connection,
and the work upstream is cancelled.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Coroutine

import aiohttp
import orjson

from modelplex.http import from_json, internal_session, is_json
from modelplex.wire.codec import (CALL_CONTENT_TYPE, STREAM_CONTENT_TYPE, VALUE_CONTENT_TYPE, Call, RemoteStreamError,
                                  decode_value, encode_call, from_plain)
from modelplex.wire.errors import (BadRequest, ModelplexError, ReplicaFailed, RequestCancelledError, UpstreamTimeout,
                                   error_for_status)
from modelplex.wire.ids import InvalidModelId, validate_model_id
from modelplex.wire.names import ENV_POD_NAMESPACE, MODEL_ID_HEADER, dns_label, router_env_name
from modelplex.wire.spec import DEFAULT_ROUTER_PORT

log = logging.getLogger("modelplex.handles")

#: The longest record (one streamed item) a stream may send; one is held at a time.
MAX_RECORD_BYTES = 64 * 1024 * 1024


#: Pooled sessions per event loop, one per router: keep-alive connections. Per router, so that
#: the connections to a router that ``serve.run`` replaced go alone (:func:`forget_routers`).
_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, aiohttp.ClientSession]] = \
    weakref.WeakKeyDictionary()
#: Per event loop, the suspended async generator whose closing closes its sessions (see _closer).
_closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncIterator[None]] = weakref.WeakKeyDictionary()
#: Per event loop, the sessions of routers that are gone, to close there (:func:`forget_routers`).
_retired: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[aiohttp.ClientSession]] = \
    weakref.WeakKeyDictionary()
#: Routers that ``serve.run`` moved: a handle made before the move follows it.
_moved: dict[str, str] = {}
#: How long a call whose connection was refused waits before its one retry (a router restarting).
RETRY_AFTER_S = 0.5
#: How long the exit waits for the background loop's connections to close.
CLOSE_TIMEOUT_S = 2.0


def _session(url: str) -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    pool = _sessions.get(loop)
    if pool is None:
        pool = _sessions[loop] = {}
        _close_with(loop)
    session = pool.get(url)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60)
        session = pool[url] = internal_session(connector=connector, auto_decompress=False)
    return session


def _close_with(loop: asyncio.AbstractEventLoop) -> None:
    """Close the loop's sessions as the loop ends: ``asyncio.run`` (and every loop runner)
    closes the async generators a loop started before closing it, so a script's pooled
    connections are closed, not left to the garbage collector's "Unclosed client session"."""
    closer = _closer()
    _closers[loop] = closer  # a strong reference: the loop holds its generators weakly
    loop.create_task(_first_step(closer))


async def _closer() -> AsyncIterator[None]:
    try:
        yield
    finally:
        await close_handles()


async def _first_step(closer: AsyncIterator[None]) -> None:
    await closer.__anext__()


def _route(url: str) -> str:
    return _moved.get(url, url)


def router_moved(old: str, new: str) -> None:
    """``serve.run`` replaced the router at ``old`` by one at ``new``: handles follow."""
    old, new = old.rstrip("/"), new.rstrip("/")
    if old != new:
        _moved[old] = new
        for origin, target in list(_moved.items()):
            if target == old:
                _moved[origin] = new


def forget_routers(urls: list[str]) -> None:
    """Drop the pooled connections to routers that are gone (``serve.run`` replaced or deleted
    them), in every loop: the next call connects anew instead of writing into a dead socket.
    Their sessions are closed by their own loop, at its next call or at its end (a loop that
    runs cells one by one may not run in between)."""
    for loop, pool in list(_sessions.items()):
        for url in urls:
            session = pool.pop(url.rstrip("/"), None)
            if session is not None and not loop.is_closed():
                _retired.setdefault(loop, []).append(session)


async def _close_retired() -> None:
    for session in _retired.pop(asyncio.get_running_loop(), None) or ():
        await session.close()


async def close_handles() -> None:
    """Close this event loop's pooled connections (the replica does this at shutdown)."""
    loop = asyncio.get_running_loop()
    await _close_retired()
    pool = _sessions.pop(loop, None) or {}
    _closers.pop(loop, None)
    for session in pool.values():
        await session.close()


class _BackgroundLoop:
    """An event loop in a daemon thread, for calls made where no loop runs (a script, a sync handler)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="modelplex-handles", daemon=True).start()
            return self._loop

    def close(self) -> None:
        """Close the background loop's connections (at exit: its thread never ends on its own)."""
        loop = self._loop
        if loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(close_handles(), loop).result(CLOSE_TIMEOUT_S)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # exiting anyway


_background = _BackgroundLoop()
# Registered at import, before serve.run's own shutdown (which imports this module): exit
# handlers run last first, so the applications stop (and their routers are forgotten) before
# the background loop's connections close.
atexit.register(_background.close)


class _Started:
    """A coroutine started at once on its owner loop (the caller's, else the background one):
    awaited there directly, from another loop or thread through a linked future."""

    def __init__(self, coroutine: Coroutine, loop: asyncio.AbstractEventLoop | None = None):
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        self.loop = loop or running or _background.get()
        self.task: asyncio.Task | None = None
        self._future: concurrent.futures.Future | None = None
        self._lock = threading.Lock()
        if self.loop is running:
            self.task = self.loop.create_task(coroutine)
        else:
            self._future = concurrent.futures.Future()
            self.loop.call_soon_threadsafe(self._start, coroutine)

    def _start(self, coroutine: Coroutine) -> None:  # on the owner loop
        if self._future is not None and self._future.cancelled():
            coroutine.close()
            return
        self.task = self.loop.create_task(coroutine)
        self._link()

    def _link(self) -> None:  # on the owner loop: the task's outcome goes to the future, a cancel back
        task, future = self.task, self._future
        if task is None or future is None:  # both set before this runs
            return

        def copy(_: asyncio.Task) -> None:
            try:
                if task.cancelled():
                    future.cancel()
                elif task.exception() is not None:
                    future.set_exception(task.exception())
                else:
                    future.set_result(task.result())
            except concurrent.futures.InvalidStateError:
                pass  # cancelled meanwhile from another thread

        task.add_done_callback(copy)
        future.add_done_callback(lambda done: done.cancelled() and self.loop.call_soon_threadsafe(task.cancel))

    def concurrent(self) -> concurrent.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = concurrent.futures.Future()
                self.loop.call_soon_threadsafe(self._link)
            return self._future

    def awaitable(self) -> Awaitable[Any]:
        if self.task is not None and asyncio.get_running_loop() is self.loop:
            return self.task  # the common case: no thread hop
        return asyncio.wrap_future(self.concurrent())

    def cancel(self) -> None:
        if self._future is not None:
            self._future.cancel()
        elif self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)


def resolve(deployment: str) -> str:
    """The router URL of ``deployment`` (its name, or Ray's class name: ``SimpleModel`` is
    ``simple-model``): local mode's variable, else its in-cluster Service."""
    try:
        label = dns_label(deployment)
    except ValueError:
        label = deployment
    url = os.environ.get(router_env_name(deployment)) or os.environ.get(router_env_name(label))
    if url:
        return url.rstrip("/")
    namespace = os.environ.get(ENV_POD_NAMESPACE)
    if namespace:
        return f"http://{label}.{namespace}.svc:{DEFAULT_ROUTER_PORT}"
    raise LookupError(
        f"cannot find deployment {deployment!r}: set {router_env_name(deployment)} to its router's URL, "
        "run it with `modelplex local`, or run in a cluster (POD_NAMESPACE)"
    )


def _not_in_a_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{what} blocks: inside an event loop, use `await` instead")


class DeploymentResponse:
    """The answer to one ``.remote()`` call, already on its way."""

    def __init__(self, started: _Started):
        self._started = started
        self._cancelled = False

    def __await__(self):
        return self._answer().__await__()

    async def _answer(self) -> Any:
        try:
            return await self._started.awaitable()
        except asyncio.CancelledError:
            if self._cancelled:  # this response's cancel(), not the awaiting task's: Ray's error
                raise RequestCancelledError() from None
            raise

    def result(self, timeout_s: float | None = None) -> Any:
        """Wait for the answer (outside an event loop); ``TimeoutError`` after ``timeout_s``."""
        _not_in_a_loop("DeploymentResponse.result()")
        try:
            return self._started.concurrent().result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no answer within {timeout_s:g} s") from None
        except concurrent.futures.CancelledError:
            raise RequestCancelledError() from None

    def cancel(self) -> None:
        """Give up on the answer: the request is aborted and the work upstream cancelled;
        awaiting the response then raises Ray's ``RequestCancelledError``."""
        self._cancelled = True
        self._started.cancel()

    async def _to_object_ref(self) -> ObjectRef:
        """Ray's private API for a reference to the answer, to pass to other calls: here the answer."""
        return ObjectRef(await self)

    def _to_object_ref_sync(self, timeout_s: float | None = None) -> ObjectRef:
        return ObjectRef(self.result(timeout_s))


class ObjectRef:
    """What Ray's ``_to_object_ref()`` and ``_to_object_ref_gen()`` give: a value to pass to
    another handle call (it arrives there as the value) or to await. Modelplex has no object
    store: the value passed through the caller on its way."""

    __slots__ = ("_value",)

    def __init__(self, value: Any):
        self._value = value

    def __await__(self):
        yield from ()
        return self._value

    def __repr__(self) -> str:
        return f"ObjectRef({type(self._value).__name__})"


_END = object()


class DeploymentResponseGenerator:
    """The items of one streaming call; the request is sent at once, items are read on demand,
    on the loop that made the call (from another loop or thread, through it)."""

    def __init__(self, records: AsyncGenerator[Any, None]):
        self._records = records
        self._closed = False
        self._next: _Started | None = _Started(_next_or_end(records))  # sends the request now
        self._loop = self._next.loop

    def _step(self) -> _Started:
        if self._next is None:
            self._next = _Started(_next_or_end(self._records), self._loop)
        return self._next

    def __aiter__(self) -> DeploymentResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        if self._closed:
            raise StopAsyncIteration
        try:
            item = await self._step().awaitable()  # cancelling the reader cancels the read
        except BaseException:
            # A failed or cancelled read ends the stream. A read cancelled before it began
            # never reached the records: close them, or the connection would stay open.
            self.cancel()
            raise
        finally:
            self._next = None
        if item is _END:
            self._closed = True
            raise StopAsyncIteration
        return item

    def __iter__(self) -> DeploymentResponseGenerator:
        return self

    def __next__(self) -> Any:
        _not_in_a_loop("iterating a DeploymentResponseGenerator with `for`")
        if self._closed:
            raise StopIteration
        try:
            item = self._step().concurrent().result()
        except BaseException:
            self._closed = True
            raise
        finally:
            self._next = None
        if item is _END:
            self._closed = True
            raise StopIteration
        return item

    async def aclose(self) -> None:
        """Stop reading: the connection closes and the producer upstream is cancelled."""
        if not self._closed:
            self._closed = True
            await _Started(_close(self._records, self._next), self._loop).awaitable()

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            _Started(_close(self._records, self._next), self._loop)

    async def __aenter__(self) -> DeploymentResponseGenerator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _to_object_ref_gen(self) -> AsyncIterator[ObjectRef]:
        """Ray's private API that the seeds' streaming pipeline uses: the items as references
        to pass to other calls (``handle.run.remote(ref)`` receives the item)."""
        return _references(self)


async def _references(items: DeploymentResponseGenerator) -> AsyncIterator[ObjectRef]:
    async for item in items:
        yield ObjectRef(item)


async def _next_or_end(records: AsyncIterator[Any]) -> Any:
    try:
        return await records.__anext__()
    except StopAsyncIteration:
        return _END


async def _close(records: AsyncGenerator[Any, None], pending: _Started | None) -> None:  # on the owner loop
    if pending is not None:
        if pending.task is None:
            pending.cancel()  # not started yet: it never will be
        elif not pending.task.done():
            pending.task.cancel()
            await asyncio.gather(pending.task, return_exceptions=True)
    await records.aclose()


@dataclass(frozen=True)
class DeploymentHandle:
    """A reference to a deployment: :meth:`options` returns a changed copy, ``.remote()`` calls
    ``__call__``, and ``handle.<method>.remote()`` calls a method by name."""

    deployment: str
    url: str
    multiplexed_model_id: str = ""
    stream: bool = False
    method_name: str = "__call__"
    path: str = "/"
    timeout_s: float = 300.0

    def options(
        self,
        *,
        multiplexed_model_id: str | None = None,
        stream: bool | None = None,
        method_name: str | None = None,
        path: str | None = None,
        timeout_s: float | None = None,
        _prefer_local_routing: bool | None = None,
    ) -> DeploymentHandle:
        """A copy with these options changed (None: unchanged). ``_prefer_local_routing``, Ray's
        private hint to route to a replica on the caller's node, is accepted and ignored: every
        call goes through the deployment's router, which picks by model and load."""
        if _prefer_local_routing is not None:
            log.debug("%s: _prefer_local_routing=%s ignored: calls are routed by the deployment's router",
                      self.deployment, _prefer_local_routing)
        if multiplexed_model_id:
            try:
                validate_model_id(multiplexed_model_id)
            except InvalidModelId as error:
                raise BadRequest(f"{self.deployment}: {error}") from None
        changes: dict[str, Any] = {
            key: value
            for key, value in (
                ("multiplexed_model_id", multiplexed_model_id),
                ("stream", stream),
                ("method_name", method_name),
                ("path", path),
                ("timeout_s", timeout_s),
            )
            if value is not None
        }
        return replace(self, **changes)

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("_"):
            raise AttributeError(name)
        return replace(self, method_name=name)

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse | DeploymentResponseGenerator:
        """Call the deployment now: an awaitable response, or (``stream=True``) an async iterator."""
        if any(isinstance(value, ObjectRef) for value in (*args, *kwargs.values())):
            args = tuple(_dereferenced(arg) for arg in args)
            kwargs = {key: _dereferenced(value) for key, value in kwargs.items()}
        call = Call(self.method_name, args, kwargs, self.stream)
        # Encoding here makes an argument that cannot travel fail in the caller, at once;
        # a call that takes another call's response encodes once that has arrived.
        waits = any(isinstance(value, _RESPONSES) for value in (*args, *kwargs.values()))
        body = None if waits else encode_call(call)
        if self.stream:
            return DeploymentResponseGenerator(self._stream(call, body))
        return DeploymentResponse(_Started(self._call(call, body)))

    # -- on the handle loop ----------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": CALL_CONTENT_TYPE, "Accept": f"{VALUE_CONTENT_TYPE}, {STREAM_CONTENT_TYPE}"}
        if self.multiplexed_model_id:
            headers[MODEL_ID_HEADER] = self.multiplexed_model_id
        return headers

    async def _post(self, body: bytes, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """Send the call. A connection refused sent nothing (a router restarting, or one that
        ``serve.run`` replaced): it is tried once more, at the router's new address if it moved."""
        await _close_retired()
        for attempt in range(2):
            url = _route(self.url)
            try:
                return await _session(url).post(url + self.path, data=body, headers=self._headers(), timeout=timeout)
            except aiohttp.ClientConnectorError:
                if attempt:
                    raise
                log.debug("%s: connection to %s refused; trying once more", self.deployment, url)
                await asyncio.sleep(RETRY_AFTER_S)
        raise AssertionError("unreachable")

    async def _call(self, call: Call, body: bytes | None) -> Any:
        body = body if body is not None else encode_call(await _resolved(call))
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with await self._post(body, timeout) as response:
                data = await response.read()
                if response.status >= 400:
                    raise _error(self.deployment, response.status, data)
                if response.content_type == STREAM_CONTENT_TYPE:
                    raise BadRequest(f"{self.deployment}.{call.method} streams its answer: "
                                     "call it with .options(stream=True)")
                return _decode(response.content_type, data)
        except TimeoutError:
            raise UpstreamTimeout(f"{self.deployment}: no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientError as error:
            raise ReplicaFailed(f"{self.deployment}: {error}") from None

    async def _stream(self, call: Call, body: bytes | None) -> AsyncGenerator[Any, None]:
        body = body if body is not None else encode_call(await _resolved(call))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.timeout_s)
        try:
            async with await self._post(body, timeout) as response:
                if response.status >= 400:
                    raise _error(self.deployment, response.status, await response.read())
                if response.content_type != STREAM_CONTENT_TYPE:
                    raise BadRequest(f"{self.deployment}.{call.method} does not stream: "
                                     "call it without .options(stream=True)")
                async for line in _lines(response.content, self.deployment):
                    item = _parse(line, self.deployment)
                    if isinstance(item, RemoteStreamError):
                        raise error_for_status(500, f"{self.deployment}: {item.message}", item.code, item.type,
                                               item.module)
                    yield item
        except aiohttp.ClientPayloadError:
            raise ReplicaFailed(f"{self.deployment}: the stream broke off") from None
        except TimeoutError:
            raise UpstreamTimeout(f"{self.deployment}: no item within {self.timeout_s:g} s") from None
        except aiohttp.ClientError as error:
            raise ReplicaFailed(f"{self.deployment}: {error}") from None


_RESPONSES = (DeploymentResponse,)


def _dereferenced(value: Any) -> Any:
    return value._value if isinstance(value, ObjectRef) else value


async def _resolved(call: Call) -> Call:
    """``call`` with each response among its arguments replaced by its value."""

    async def value(argument: Any) -> Any:
        return await argument if isinstance(argument, DeploymentResponse) else argument

    args = [await value(arg) for arg in call.args]
    kwargs = {key: await value(arg) for key, arg in call.kwargs.items()}
    return replace(call, args=tuple(args), kwargs=kwargs)


async def _lines(content: aiohttp.StreamReader, deployment: str) -> AsyncIterator[bytes]:
    """The non-empty lines of a body as they arrive, each up to :data:`MAX_RECORD_BYTES`.

    Not ``StreamReader.readline``: it refuses lines longer than aiohttp's read buffer's
    high-water mark (512 KiB; 128 KiB in older aiohttp), which one chunk of frames passes.
    Data is read only when the consumer asks for the next line (backpressure).
    """
    buffer = bytearray()
    async for data in content.iter_any():
        searched = len(buffer)  # the held part has no newline: search only the new data
        buffer += data
        start = 0
        while (newline := buffer.find(b"\n", max(start, searched))) != -1:
            if newline > start:
                yield bytes(buffer[start:newline])
            start = newline + 1
        del buffer[:start]
        if len(buffer) > MAX_RECORD_BYTES:
            raise ReplicaFailed(f"{deployment}: a streamed record passed {MAX_RECORD_BYTES} bytes")
    if buffer.strip():
        yield bytes(buffer)


def _parse(line: bytes, deployment: str) -> Any:
    try:
        return from_plain(orjson.loads(line))
    except ValueError:
        raise ReplicaFailed(f"{deployment}: a streamed record is not valid: {line[:80]!r}") from None


def _decode(content_type: str, data: bytes) -> Any:
    if content_type == VALUE_CONTENT_TYPE:
        return decode_value(data)
    if is_json(content_type):
        return from_json(data)
    if content_type.startswith("text/"):
        return data.decode()
    return data


def _error(deployment: str, status: int, data: bytes) -> ModelplexError:
    try:
        error = from_json(data)["error"]
        message, code, error_type, module = error["message"], error.get("code"), error.get("type"), error.get("module")
    except (ValueError, KeyError, TypeError):
        message, code, error_type, module = data[:200].decode(errors="replace") or f"HTTP {status}", None, None, None
    return error_for_status(status, f"{deployment}: {message}", code, error_type, module)


def handle(deployment: str, *, url: str | None = None) -> DeploymentHandle:
    """A handle to ``deployment`` (resolved through its router; ``url`` overrides)."""
    return DeploymentHandle(deployment=deployment, url=(url or resolve(deployment)).rstrip("/"))
