"""file: and http(s): model sources, against a real HTTP server on loopback."""

import os
import sys

import pytest
from aiohttp import web

from modelplex.wire.errors import ModelLoadError, ModelNotFound
from modelplex.wire.ids import InvalidModelId
from modelplex_replica.sources import ModelSource, fd_path

from support.servers import serving


@pytest.fixture
async def model_server(tmp_path):
    (tmp_path / "m1.pt").write_bytes(b"weights-of-m1")
    app = web.Application()
    app.router.add_static("/models", tmp_path)
    async with serving(app) as url:
        yield url


async def test_http_source_fetches_and_maps_404(model_server):
    source = ModelSource(model_server + "/models/{model_id}.pt")
    assert await source.fetch("m1") == b"weights-of-m1"
    with pytest.raises(ModelNotFound):
        await source.fetch("m2")


async def test_relative_file_source_resolves_against_the_manifest_folder(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "m1.pt").write_bytes(b"local")
    source = ModelSource("file:store/{model_id}.pt", base_dir=tmp_path)
    assert await source.fetch("m1") == b"local"
    absolute = ModelSource(f"file://{tmp_path}/store/{{model_id}}.pt")
    assert await absolute.fetch("m1") == b"local"


async def test_ids_that_look_like_paths_stay_inside_the_source(tmp_path):
    (tmp_path / "secret.pt").write_bytes(b"secret")
    (tmp_path / "store").mkdir()
    source = ModelSource("file:store/{model_id}.pt", base_dir=tmp_path)
    for model_id in ["/etc/passwd", "%2Fsecret", "a//secret"]:
        with pytest.raises(ModelNotFound):
            await source.fetch(model_id)
    for model_id in ["", "new\nline", "../secret", "..", "%2e%2e/secret", "a/../../secret", "..\\secret"]:
        with pytest.raises(InvalidModelId):
            await source.fetch(model_id)


async def test_hugging_face_style_ids_read_from_their_folders(tmp_path):
    (tmp_path / "store" / "meta-llama").mkdir(parents=True)
    (tmp_path / "store" / "meta-llama" / "Llama-2-7b-hf.pt").write_bytes(b"weights")
    source = ModelSource("file:store/{model_id}.pt", base_dir=tmp_path)
    assert await source.fetch("meta-llama/Llama-2-7b-hf") == b"weights"


async def test_an_http_model_is_fetched_into_a_file_in_no_folder_and_a_cut_body_is_an_error(model_server, tmp_path):
    source = ModelSource(model_server + "/models/{model_id}.pt")
    with await source.fetch_file("m1") as file:
        with open(fd_path(file), "rb") as reopened:  # as a loader that takes paths opens it
            assert reopened.read() == b"weights-of-m1"
        if sys.platform == "linux":
            assert os.readlink(fd_path(file)).startswith("/memfd:")  # memory, not the pod's disk
    with pytest.raises(ModelNotFound):
        await source.fetch_file("m2")

    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "100"})
        await response.prepare(request)
        await response.write(b"only part")
        request.transport.close()  # the connection drops before the announced 100 bytes
        return response

    app = web.Application()
    app.router.add_get("/cut/{name}", cut)
    async with serving(app) as url:
        with pytest.raises(ModelLoadError, match="fetching model 'm1'") as error:
            await ModelSource(url + "/cut/{model_id}?X-Amz-Signature=secret").fetch_file("m1")
    assert "secret" not in str(error.value)  # a signed URL's query is never shown
