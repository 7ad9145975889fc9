"""file: and http(s): model sources, against a real HTTP server on loopback."""

import pytest
from aiohttp import web

from modelplex.wire.errors import ModelNotFound
from modelplex.wire.ids import InvalidModelId
from modelplex_replica.sources import ModelSource

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
