"""``format: safetensors``: state_dicts saved by the test, mapped into module classes; the errors
name what does not fit; metadata declared in the file or inspected from the eager module."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save, save_file

from modelplex.wire.errors import BadRequest, ModelLoadError
from modelplex.wire.oip import InferRequest
from modelplex_replica.builtin import _inspect_metadata, _loaded, check_inputs
from modelplex_replica.statedict import METADATA_KEY, build_module, read_bytes, read_file


class Mlp(torch.nn.Module):
    def __init__(self, width: int = 16, out: int = 4):
        super().__init__()
        self.inner = torch.nn.Linear(width, 32)
        self.outer = torch.nn.Linear(32, out)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(features)))


class Scaled(Mlp):
    """A buffer computed in ``__init__`` and left out of the state_dict."""

    def __init__(self, width: int = 16, out: int = 4):
        super().__init__(width, out)
        self.register_buffer("scale", torch.full((out,), 3.0), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return super().forward(features) * self.scale


def mapped_from(path, address: int) -> bool:
    """Whether ``address`` lies in a mapping of ``path`` (Linux's /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *_, name = line.split(maxsplit=5)
            start, stop = (int(part, 16) for part in span.split("-"))
            if name.strip() == str(path) and start <= address < stop:
                return True
    return False


def saved(tmp_path, module, name="m", metadata=None):
    path = tmp_path / f"{name}.safetensors"
    save_file(module.state_dict(), str(path), metadata=metadata)
    return path


def test_a_file_is_mapped_not_read_and_answers_as_the_saved_module(tmp_path):
    torch.manual_seed(0)
    original = Mlp(16, 4).eval()
    path = saved(tmp_path, original)
    tensors, declared = read_file("m", path)
    module = build_module("m", Mlp, {"width": 16, "out": 4}, tensors)
    x = torch.randn(5, 16)
    assert torch.equal(module(x), original(x))
    assert declared == ""
    # The weights are views of the file's pages, not a copy in anonymous memory.
    assert all(mapped_from(path, p.data_ptr()) for p in module.parameters())
    assert not any(mapped_from(path, p.data_ptr()) for p in original.parameters())
    assert not module.training


def test_buffers_outside_the_state_dict_are_computed_by_the_class(tmp_path):
    torch.manual_seed(1)
    original = Scaled().eval()
    module = build_module("s", Scaled, {}, read_file("s", saved(tmp_path, original))[0])
    x = torch.randn(2, 16)
    assert torch.equal(module(x), original(x))
    assert module.scale.tolist() == [3.0] * 4


def test_bytes_from_a_remote_source_load_the_same_with_their_metadata():
    torch.manual_seed(2)
    original = Mlp(8, 2).eval()
    declared = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}],
                          "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]})
    tensors, text = read_bytes("m", save(original.state_dict(), metadata={METADATA_KEY: declared}))
    module = build_module("m", Mlp, {"width": 8, "out": 2}, tensors)
    x = torch.randn(3, 8)
    assert torch.equal(module(x), original(x))
    loaded = _loaded("m", module, text)
    assert [i["name"] for i in loaded.inputs] == ["x"] and loaded.output_names == ["y"]


def test_metadata_declared_in_the_file_is_read_back(tmp_path):
    declared = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 16]}],
                "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]}]}
    path = saved(tmp_path, Mlp(), metadata={METADATA_KEY: json.dumps(declared)})
    tensors, text = read_file("m", path)
    loaded = _loaded("m", build_module("m", Mlp, {}, tensors), text)
    assert loaded.inputs[0]["name"] == "pixels" and loaded.outputs[0]["shape"] == [-1, 4]


def test_an_eager_modules_metadata_is_inspected_from_its_signature_and_layers():
    inputs, outputs, checks = _inspect_metadata(Mlp(16, 4).eval())
    assert [(i["name"], i["datatype"], i["shape"]) for i in inputs] == [("features", "FP32", [-1, 16])]
    assert outputs[0]["shape"] == [-1, 4]
    check_inputs(InferRequest({"features": np.zeros((2, 16), np.float32)}), checks)
    with pytest.raises(BadRequest, match="expected shape"):
        check_inputs(InferRequest({"features": np.zeros((2, 5), np.float32)}), checks)
    half = _inspect_metadata(Mlp(16, 4).to(torch.float16))[0]
    assert half[0]["datatype"] == "FP16"  # the file's dtype is kept


def test_weights_that_do_not_fit_the_class_are_named(tmp_path):
    tensors = read_file("m", saved(tmp_path, Mlp(16, 4)))[0]
    with pytest.raises(ModelLoadError, match=r"model 'm'.*not in the module: inner.bias") as wrong_class:
        build_module("m", torch.nn.Linear, {"in_features": 16, "out_features": 32}, tensors)
    assert "missing from the file: bias, weight" in str(wrong_class.value)
    with pytest.raises(ModelLoadError, match="size mismatch") as wrong_shape:
        build_module("m", Mlp, {"width": 8}, tensors)
    assert "'m'" in str(wrong_shape.value)


def test_a_broken_file_a_failing_constructor_and_a_non_module_are_load_errors(tmp_path):
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ModelLoadError, match="'broken' is not a safetensors file"):
        read_file("broken", broken)
    with pytest.raises(ModelLoadError, match="'b' is not a safetensors file"):
        read_bytes("b", b"nonsense")
    with pytest.raises(FileNotFoundError):
        read_file("gone", tmp_path / "gone.safetensors")
    tensors = read_file("m", saved(tmp_path, Mlp()))[0]
    with pytest.raises(ModelLoadError, match=r"Mlp\(\*\*kwargs\) failed: TypeError"):
        build_module("m", Mlp, {"depth": 3}, tensors)
    with pytest.raises(ModelLoadError, match="is not a torch.nn.Module"):
        build_module("m", dict, {}, tensors)


def test_a_downloaded_buffer_is_viewed_in_place_and_its_entries_are_checked():
    torch.manual_seed(3)
    original = Mlp(8, 2).eval()
    buffer = bytearray(save(original.state_dict()))
    tensors, _ = read_bytes("m", buffer)
    start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    assert all(start <= t.data_ptr() < start + len(buffer) for t in tensors.values())  # views, no copy
    assert torch.equal(build_module("m", Mlp, {"width": 8, "out": 2}, tensors)(torch.ones(1, 8)),
                       original(torch.ones(1, 8)))
    header_length = int.from_bytes(buffer[:8], "little")
    header = json.loads(buffer[8:8 + header_length])
    name = next(key for key in header if key != "__metadata__")
    for change, message in ((lambda e: e.update(data_offsets=[0, 10**9]), "do not hold"),
                            (lambda e: e.update(dtype="Q4"), "unknown dtype 'Q4'")):
        broken = json.loads(json.dumps(header))
        change(broken[name])
        text = json.dumps(broken).encode()
        with pytest.raises(ModelLoadError, match=message):
            read_bytes("m", len(text).to_bytes(8, "little") + text + bytes(buffer[8 + header_length:]))
