"""The built-in handler's input checks and the cause it keeps from a TorchScript error, on real modules."""

import warnings

import numpy as np
import pytest
import torch

from modelplex.wire.errors import BadRequest
from modelplex.wire.oip import InferRequest
from modelplex_replica.builtin import _inspect_metadata, check_inputs, model_error_cause


def scripted(module: torch.nn.Module) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.script(module.eval())


def test_a_torchscript_error_keeps_its_cause_not_its_header_or_server_paths():
    module = scripted(torch.nn.Sequential(torch.nn.Linear(16, 4)))
    with pytest.raises(RuntimeError) as raised:
        module(torch.zeros(2, 5))
    cause = model_error_cause(raised.value)
    assert "2x5" in cause and "16" in cause  # mat1 and mat2 shapes cannot be multiplied (2x5 and 16x4)
    assert "TorchScript interpreter" not in cause and "File " not in cause


def test_inspected_linear_models_check_names_datatypes_and_widths():
    _, _, checks = _inspect_metadata(scripted(torch.nn.Sequential(torch.nn.Linear(16, 4))))
    check_inputs(InferRequest({"input": np.zeros((3, 16), np.float32)}), checks)
    cases = [
        ({"input": np.zeros((3, 16), np.float64)}, "input 'input': expected datatype FP32, got FP64"),
        ({"pixels": np.zeros((3, 16), np.float32)}, "unknown input 'pixels': the model takes ['input']"),
        ({"input": np.zeros((3, 5), np.float32)}, "input 'input': expected shape [-1, 16] (-1: any size), got [3, 5]"),
        ({"input": np.zeros((16,), np.float32)}, "expected shape [-1, 16]"),
    ]
    for inputs, message in cases:
        with pytest.raises(BadRequest) as refused:
            check_inputs(InferRequest(inputs), checks)
        assert message in str(refused.value)


def test_declared_inputs_that_are_missing_are_named():
    checks = ({"name": "a", "datatype": "FP32", "shape": [-1, 2]}, {"name": "b", "datatype": "INT64", "shape": [-1]})
    with pytest.raises(BadRequest, match="missing input 'b'"):
        check_inputs(InferRequest({"a": np.zeros((1, 2), np.float32)}), checks)
    check_inputs(InferRequest({"a": np.zeros((1, 2), np.float32), "b": np.zeros((1,), np.int64)}), checks)


def test_a_model_whose_first_layer_is_not_linear_is_not_held_to_a_guessed_datatype():
    class Embedder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 8)
            self.head = torch.nn.Linear(8, 2)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids))

    _, _, checks = _inspect_metadata(scripted(Embedder()))
    check_inputs(InferRequest({"ids": np.zeros((3, 7), np.int64)}), checks)  # integer ids of any length
    with pytest.raises(BadRequest, match="unknown input 'x'"):
        check_inputs(InferRequest({"x": np.zeros((3, 7), np.int64)}), checks)
