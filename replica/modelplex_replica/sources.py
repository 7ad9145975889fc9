"""Model sources: fetch one model's bytes from ``modelSource.uri`` with ``{model_id}`` filled in.

``file://`` (or ``file:relative/path``, resolved against the manifest's folder), ``http(s)://``
and ``s3://bucket/key``. S3 credentials and endpoint come from the standard AWS variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``),
which the operator fills from ``modelSource.secretRef``. http(s) credentials come from the
same Secret: each ``MODELPLEX_SOURCE_HEADER_<NAME>`` variable is sent as the header ``<NAME>``
(``MODELPLEX_SOURCE_HEADER_AUTHORIZATION`` → ``Authorization``); see :func:`source_headers`.
They go to the source's own origin only: a redirect elsewhere is followed without them.

No id leaves its source: ids with ``.``/``..`` segments are refused before any fetch
(:func:`~modelplex.wire.ids.validate_model_id`), and the URL is sent exactly as built
(``encoded=True``: the HTTP client neither decodes ``%2E``/``%2F`` nor resolves dot segments).
A signed URL's query reaches the store unchanged; every message names the source through
:func:`~modelplex.wire.redact.redact_url`.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Awaitable, Callable, Mapping, TypeVar
from urllib.parse import urlparse

import aiohttp
from yarl import URL

from modelplex.wire.errors import ModelLoadError, ModelNotFound
from modelplex.wire.ids import source_key
from modelplex.wire.redact import redact_text, redact_url

#: Environment variables (from ``modelSource.secretRef`` in pods) sent as HTTP headers.
HEADER_ENV_PREFIX = "MODELPLEX_SOURCE_HEADER_"
#: Redirects an http(s) source follows (aiohttp's own default).
MAX_REDIRECTS = 10
_REDIRECTS = (301, 302, 303, 307, 308)
#: The bytes an S3 body is copied into a file by, at a time.
_COPY_CHUNK = 1 << 20
_T = TypeVar("_T")


def source_headers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers an http(s) source sends: ``MODELPLEX_SOURCE_HEADER_X_API_KEY=v`` → ``X-Api-Key: v``."""
    environ = os.environ if environ is None else environ
    return {"-".join(part.capitalize() for part in name[len(HEADER_ENV_PREFIX):].split("_")): value
            for name, value in environ.items() if name.startswith(HEADER_ENV_PREFIX) and len(name) > len(HEADER_ENV_PREFIX)}


class ModelSource:
    """Where models live; :meth:`fetch` returns a model's bytes."""

    def __init__(self, uri: str, *, base_dir: Path | None = None, timeout_s: float = 300.0,
                 headers: Mapping[str, str] | None = None):
        self.uri = uri
        #: The source as messages name it: no userinfo, no query values.
        self.shown = redact_url(uri)
        self.base_dir = base_dir or Path.cwd()
        self.timeout_s = timeout_s
        self.scheme = urlparse(uri).scheme
        self.headers = dict(source_headers() if headers is None else headers)

    def locate(self, model_id: str) -> str:
        """The model's URI: ``org/name`` ids keep their folders; the rest of the id is
        percent-escaped by :func:`~modelplex.wire.ids.source_key` and used as it stands (file names
        and S3 keys hold the escapes literally, never decoded), so no id leaves the source.
        Raises :class:`~modelplex.wire.ids.InvalidModelId` (a 400) for ids with dot segments."""
        return self.uri.replace("{model_id}", source_key(model_id))

    async def fetch(self, model_id: str) -> bytes | bytearray:
        """The model's bytes (an http(s) body in a buffer of its own, which a loader may view
        without copying); :class:`ModelNotFound` when the source has no such model."""
        location = self.locate(model_id)
        if self.scheme == "file":
            return await asyncio.to_thread(self._read_file, model_id)
        if self.scheme in ("http", "https"):
            return await self._read_http(model_id, location, _body)
        if self.scheme == "s3":
            return await asyncio.to_thread(self._read_s3, model_id, location, None)
        raise ModelLoadError(f"unsupported model source scheme {self.scheme!r}")

    async def fetch_file(self, model_id: str) -> IO[bytes]:
        """The model's bytes in an anonymous file of its own, which the caller closes: a loader
        that reads by path (``torch.jit.load``) reads it as fast as a local file, where from a
        buffer torch copies the bytes three more times under the GIL (bench/swap). An http(s)
        body is written to it chunk by chunk as it arrives; no Python buffer holds the model.

        The file is in memory where the OS allows (``memfd_create``, Linux: it counts against the
        pod's memory as a buffer would, and never against its disk), else an unlinked temporary
        file. For a ``file:`` source use :meth:`local_path` instead."""
        location = self.locate(model_id)
        file = anonymous_file()
        try:
            if self.scheme in ("http", "https"):
                await self._read_http(model_id, location, lambda response: _body_to(response, file))
            elif self.scheme == "s3":
                await asyncio.to_thread(self._read_s3, model_id, location, file)
            elif self.scheme == "file":
                write_all(file, await self.fetch(model_id))
            else:
                raise ModelLoadError(f"unsupported model source scheme {self.scheme!r}")
        except BaseException:
            file.close()
            raise
        return file

    def local_path(self, model_id: str) -> Path | None:
        """The model's file for a ``file:`` source (a loader may map it in place instead of
        reading it), None for the other schemes. It may not exist: reading it says so."""
        if self.scheme != "file":
            return None
        location = self.locate(model_id)
        parsed = urlparse(location)
        if parsed.netloc not in ("", "localhost"):
            raise ModelLoadError(f"file URI with a host is not supported: {redact_url(location)}")
        path = Path(parsed.path)
        return path if path.is_absolute() else self.base_dir / path

    def missing(self, model_id: str) -> ModelNotFound:
        """The error for a model the source does not have."""
        return ModelNotFound(f"model {model_id!r} not found in {self.shown}")

    def _read_file(self, model_id: str) -> bytes:
        path = self.local_path(model_id)
        assert path is not None  # (a file: source)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise self.missing(model_id) from None
        except OSError as error:
            raise ModelLoadError(f"reading model {model_id!r} from {self.shown} failed: {error.strerror}") from None

    async def _read_http(self, model_id: str, location: str,
                         receive: Callable[[aiohttp.ClientResponse], Awaitable[_T]]) -> _T:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        shown = redact_url(location)
        try:
            # encoded=True: sent byte for byte as built; yarl would otherwise decode %2E and
            # resolve the dot segments (an id's escapes must reach the store as escapes).
            url = URL(location, encoded=True)
            origin = url.origin()
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for _ in range(MAX_REDIRECTS + 1):
                    # The source's secret headers go to its own origin only: a redirect to
                    # another host (a CDN, a signed-URL store) gets none of them.
                    headers = self.headers if url.origin() == origin else {}
                    async with session.get(url, headers=headers, allow_redirects=False) as response:
                        if response.status in _REDIRECTS and "Location" in response.headers:
                            url = url.join(URL(response.headers["Location"], encoded=True))
                            continue
                        if response.status == 404:
                            raise ModelNotFound(f"model {model_id!r} not found at {shown}")
                        if response.status != 200:
                            raise ModelLoadError(f"fetching model {model_id!r} from {shown}: HTTP {response.status}")
                        return await receive(response)
                raise ModelLoadError(f"fetching model {model_id!r} from {shown}: more than {MAX_REDIRECTS} redirects")
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise ModelLoadError(f"fetching model {model_id!r} from {shown} failed: "
                                 f"{redact_text(_describe(error))}") from None

    def _read_s3(self, model_id: str, location: str, file: IO[bytes] | None) -> bytes:
        """The object's bytes, or (``file`` given) b"" with the bytes copied into ``file``."""
        import boto3
        import botocore.exceptions

        parsed = urlparse(location)
        bucket, key = parsed.netloc, parsed.path.lstrip("/")
        client = _s3_client(boto3)
        try:
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            if file is None:
                return body.read()
            while chunk := body.read(_COPY_CHUNK):
                write_all(file, chunk)
            return b""
        except botocore.exceptions.ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ModelNotFound(f"model {model_id!r} not found at {redact_url(location)}") from None
            raise ModelLoadError(f"fetching model {model_id!r} from {redact_url(location)}: "
                                 f"{redact_text(str(code or error))}") from None
        except botocore.exceptions.BotoCoreError as error:
            raise ModelLoadError(f"fetching model {model_id!r} from {redact_url(location)} failed: "
                                 f"{redact_text(str(error))}") from None


async def _body(response: aiohttp.ClientResponse) -> bytes | bytearray:
    """The body, each chunk copied into one buffer of the announced length as it arrives: the
    loop never joins a whole model at once (``read()`` does, a stall of the serving loop as long
    as a copy of the model), and the buffer is writable, so tensors may view it."""
    length = response.content_length
    if length is None or response.headers.get("Content-Encoding", "identity") != "identity":
        return await response.read()  # length unknown, or the length of the encoded body
    buffer = bytearray(length)
    view = memoryview(buffer)
    at = 0
    async for chunk in response.content.iter_any():
        end = at + len(chunk)
        if end > length:
            raise aiohttp.ClientPayloadError(f"more than the announced {length} bytes")
        view[at:end] = chunk
        at = end
    if at != length:
        raise aiohttp.ClientPayloadError(f"{at} of the announced {length} bytes")
    return buffer


async def _body_to(response: aiohttp.ClientResponse, file: IO[bytes]) -> None:
    """The body written to ``file`` chunk by chunk as it arrives (each write a copy of one chunk,
    as :func:`_body` makes into its buffer), checked against the announced length."""
    length = response.content_length
    if response.headers.get("Content-Encoding", "identity") != "identity":
        length = None  # the announced length is the encoded body's
    at = 0
    async for chunk in response.content.iter_any():
        at += len(chunk)
        if length is not None and at > length:
            raise aiohttp.ClientPayloadError(f"more than the announced {length} bytes")
        write_all(file, chunk)
    if length is not None and at != length:
        raise aiohttp.ClientPayloadError(f"{at} of the announced {length} bytes")


def write_all(file: IO[bytes], data: bytes | bytearray | memoryview) -> None:
    """All of ``data`` into an unbuffered file (a raw write may take less than it is given)."""
    view = memoryview(data)
    while view:
        written = file.write(view)
        if not written:
            raise OSError("the model's file took no bytes")
        view = view[written:]


def anonymous_file() -> IO[bytes]:
    """A read-write file with no name in any folder, gone when closed: in memory where the OS
    has ``memfd_create`` (Linux), else an unlinked temporary file. Unbuffered, so what is
    written is in the file at once for a reader that opens it by :func:`fd_path`."""
    if hasattr(os, "memfd_create"):
        try:
            return os.fdopen(os.memfd_create("modelplex-model", os.MFD_CLOEXEC), "w+b", buffering=0)
        except OSError:
            pass  # memfd refused (a seccomp profile): the temporary file below
    return tempfile.TemporaryFile("w+b", buffering=0, prefix="modelplex-model-")


def fd_path(file: IO[bytes]) -> str:
    """A path that opens ``file`` itself, for loaders that take paths (Linux: a fresh open of the
    same file with its own offset, even once unlinked; elsewhere ``/dev/fd``)."""
    proc = Path("/proc/self/fd")
    return f"{proc if proc.is_dir() else '/dev/fd'}/{file.fileno()}"


def _describe(error: BaseException) -> str:
    """An HTTP client error without the request it was for (aiohttp's repr holds the whole URL)."""
    if isinstance(error, aiohttp.ClientResponseError):
        return f"{type(error).__name__}: HTTP {error.status} {error.message}"
    if isinstance(error, aiohttp.InvalidURL):
        return "InvalidURL"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


_clients: dict[str, object] = {}


def _s3_client(boto3: Any) -> Any:
    # boto3 clients are thread-safe and costly to build: one per process.
    if "s3" not in _clients:
        _clients["s3"] = boto3.session.Session().client("s3")
    return _clients["s3"]
