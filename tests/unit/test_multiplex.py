"""``@multiplexed``: checked at decoration and at each call, so a bad id never becomes a cache key."""

import pytest

from modelplex import multiplexed
from modelplex.wire.errors import BadRequest, EmptyModelId


class Server:
    def __init__(self):
        self.loads = []

    @multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        self.loads.append(model_id)
        return f"model {model_id}"


async def test_a_bytes_model_id_is_a_type_error_and_never_a_cache_key():
    """Bug 1 of the Ray parity issue: a bytes body handed to the loader became a cache key,
    and every later GET /v1/models failed to encode it."""
    from modelplex.multiplex import find_cache

    server = Server()
    with pytest.raises(TypeError, match="string"):
        await server.get_model(b"model-a")
    assert server.loads == []
    assert find_cache(server).loaded == []
    assert await server.get_model("model-a") == "model model-a"
    assert find_cache(server).loaded == ["model-a"]


async def test_a_loader_called_without_a_model_id_loads_nothing():
    server = Server()
    with pytest.raises(TypeError, match="model id"):
        await server.get_model()
    with pytest.raises(TypeError):
        await server.get_model(1)
    assert server.loads == []


async def test_an_empty_model_id_is_rays_value_error_and_a_400():
    server = Server()
    with pytest.raises(ValueError, match=r"^The model ID cannot be empty\.$") as raised:
        await server.get_model("")
    assert isinstance(raised.value, BadRequest)  # over HTTP: 400, its error naming the type
    assert raised.value.to_dict()["error"] == {"code": "bad_request", "message": "The model ID cannot be empty.",
                                               "type": "ValueError", "hint": EmptyModelId.HINT}
    assert server.loads == []


async def test_hugging_face_style_ids_load():
    server = Server()
    assert await server.get_model("meta-llama/Llama-2-7b-hf") == "model meta-llama/Llama-2-7b-hf"
    with pytest.raises(BadRequest, match="control"):
        await server.get_model("bad\nid")
