"""Model sources: fetch one model's bytes from ``modelSource.uri`` with ``{model_id}`` filled in.

``file://`` (or ``file:relative/path``, resolved against the manifest's folder), ``http(s)://``
and ``s3://bucket/key``. S3 credentials and endpoint come from the standard AWS variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``),
which the operator fills from ``modelSource.secretRef``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlparse

import aiohttp

from modelplex.wire.errors import ModelLoadError, ModelNotFound
from modelplex.wire.ids import source_key


class ModelSource:
    """Where models live; :meth:`fetch` returns a model's bytes."""

    def __init__(self, uri: str, *, base_dir: Path | None = None, timeout_s: float = 300.0):
        self.uri = uri
        self.base_dir = base_dir or Path.cwd()
        self.timeout_s = timeout_s
        self.scheme = urlparse(uri).scheme

    def locate(self, model_id: str) -> str:
        """The model's URI: ``org/name`` ids keep their folders; the rest of the id is
        percent-escaped by :func:`~modelplex.wire.ids.source_key` and used as it stands (file names
        and S3 keys hold the escapes literally, never decoded), so no id leaves the source."""
        return self.uri.replace("{model_id}", source_key(model_id))

    async def fetch(self, model_id: str) -> bytes:
        location = self.locate(model_id)
        if self.scheme == "file":
            return await asyncio.to_thread(self._read_file, model_id, location)
        if self.scheme in ("http", "https"):
            return await self._read_http(model_id, location)
        if self.scheme == "s3":
            return await asyncio.to_thread(self._read_s3, model_id, location)
        raise ModelLoadError(f"unsupported model source scheme {self.scheme!r}")

    def _read_file(self, model_id: str, location: str) -> bytes:
        parsed = urlparse(location)
        path = Path(parsed.path) if parsed.netloc in ("", "localhost") else None
        if path is None:
            raise ModelLoadError(f"file URI with a host is not supported: {location}")
        if not path.is_absolute():
            path = self.base_dir / path
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise ModelNotFound(f"model {model_id!r} not found in {self.uri}") from None
        except OSError as error:
            raise ModelLoadError(f"reading model {model_id!r} from {self.uri} failed: {error.strerror}") from None

    async def _read_http(self, model_id: str, location: str) -> bytes:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(location) as response:
                    if response.status == 404:
                        raise ModelNotFound(f"model {model_id!r} not found at {location}")
                    if response.status != 200:
                        raise ModelLoadError(f"fetching model {model_id!r} from {location}: HTTP {response.status}")
                    return await response.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ModelLoadError(f"fetching model {model_id!r} from {location} failed: {error!r}") from None

    def _read_s3(self, model_id: str, location: str) -> bytes:
        import boto3
        import botocore.exceptions

        parsed = urlparse(location)
        bucket, key = parsed.netloc, parsed.path.lstrip("/")
        client = _s3_client(boto3)
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except botocore.exceptions.ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ModelNotFound(f"model {model_id!r} not found at {location}") from None
            raise ModelLoadError(f"fetching model {model_id!r} from {location}: {code or error}") from None
        except botocore.exceptions.BotoCoreError as error:
            raise ModelLoadError(f"fetching model {model_id!r} from {location} failed: {error}") from None


_clients: dict[str, object] = {}


def _s3_client(boto3):
    # boto3 clients are thread-safe and costly to build: one per process.
    if "s3" not in _clients:
        _clients["s3"] = boto3.session.Session().client("s3")
    return _clients["s3"]
