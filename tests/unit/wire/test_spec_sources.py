"""spec.modelSource.uri: {model_id} only in the path after the authority, errors that name the
field without its credentials; the inputs' other fields and their defaults."""

import pytest

from modelplex.wire.spec import SpecError, parse_spec

PASSWORD = "pa55-w0rd"


def spec_with(uri: str, **more) -> dict:
    return {"image": "i", "modelSource": {"uri": uri}, **more}


@pytest.mark.parametrize(
    ("uri", "where"),
    [
        ("https://{model_id}.store.example/m.pt", "host"),
        ("https://store.example:{model_id}/m.pt", "host"),
        (f"https://u:{PASSWORD}@{{model_id}}/m.pt", "host"),
        ("s3://{model_id}/weights.pt", "bucket"),
        ("s3://models-{model_id}/weights.pt", "bucket"),
        ("http://store.example/m.pt?name={model_id}", "query"),
        ("http://store.example/m.pt#{model_id}", "fragment"),
        ("http:{model_id}", "needs a host"),
        ("file://{model_id}/m.pt", "host"),
    ],
)
def test_a_model_id_outside_the_path_is_a_spec_error_naming_the_uri(uri, where):
    with pytest.raises(SpecError) as refused:
        parse_spec(spec_with(uri))
    message = str(refused.value)
    assert message.startswith("spec.modelSource.uri: ") and where in message
    assert PASSWORD not in message


@pytest.mark.parametrize("uri", [
    "https://store.example/tenant-a/{model_id}/model.pt",
    f"https://u:{PASSWORD}@store.example/{{model_id}}.pt?sig=abc",
    "s3://models/prefix/{model_id}.pt",
    "file:models/{model_id}.pt",
    "file:///srv/models/{model_id}.pt",
])
def test_a_model_id_in_the_path_or_key_is_accepted(uri):
    assert parse_spec(spec_with(uri)).model_source.uri == uri


def test_a_uri_error_never_shows_its_credentials():
    with pytest.raises(SpecError) as refused:
        parse_spec(spec_with(f"https://u:{PASSWORD}@store.example/m.pt?sig=t0k"))  # no {model_id}
    assert PASSWORD not in str(refused.value) and "t0k" not in str(refused.value)
    assert "REDACTED" in str(refused.value)


def test_body_timeout_and_not_found_cache_defaults_and_bounds():
    spec = parse_spec(spec_with("file:m/{model_id}.pt"))
    assert spec.router.body_timeout_seconds == 30.0
    assert spec.multiplexing.not_found_cache_seconds == 5.0
    tuned = parse_spec(spec_with("file:m/{model_id}.pt", router={"bodyTimeoutSeconds": 3},
                                 multiplexing={"notFoundCacheSeconds": 0}))
    assert tuned.router.body_timeout_seconds == 3 and tuned.multiplexing.not_found_cache_seconds == 0
    for bad in ({"router": {"bodyTimeoutSeconds": 0}}, {"multiplexing": {"notFoundCacheSeconds": -1}}):
        with pytest.raises(SpecError):
            parse_spec(spec_with("file:m/{model_id}.pt", **bad))


def test_the_format_defaults_to_torchscript_and_safetensors_names_its_module_class():
    source = parse_spec(spec_with("file:m/{model_id}.pt")).model_source
    assert source is not None and source.format == "torchscript" and source.module is None and source.kwargs == {}
    spec = {"image": "i", "modelSource": {"uri": "file:m/{model_id}.safetensors", "format": "safetensors",
                                          "module": "nets.mlp:Mlp", "kwargs": {"width": 512, "act": "gelu"}}}
    source = parse_spec(spec).model_source
    assert source is not None and (source.format, source.module, source.kwargs) == (
        "safetensors", "nets.mlp:Mlp", {"width": 512, "act": "gelu"})


@pytest.mark.parametrize(("source", "message"), [
    ({"format": "safetensors"}, "spec.modelSource: module is required with format: safetensors"),
    ({"format": "safetensors", "module": "nets"}, "spec.modelSource.module: must look like 'module.path:ClassName'"),
    ({"module": "nets:Mlp"}, "spec.modelSource: module and kwargs go with format: safetensors only"),
    ({"kwargs": {"width": 3}}, "spec.modelSource: module and kwargs go with format: safetensors only"),
    ({"format": "onnx"}, "spec.modelSource.format: Input should be 'torchscript' or 'safetensors' (got 'onnx')"),
])
def test_a_source_whose_format_and_module_disagree_is_a_spec_error_naming_the_field(source, message):
    with pytest.raises(SpecError) as refused:
        parse_spec({"image": "i", "modelSource": {"uri": "file:m/{model_id}.st", **source}})
    assert message in str(refused.value)
