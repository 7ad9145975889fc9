"""The built-in handler: one model file per model id, batched forward passes.

Two formats (``spec.modelSource.format``): ``torchscript`` (the default, a ``torch.jit.save``-d
module) and ``safetensors`` (a state_dict memory-mapped into ``modelSource.module``'s class,
:mod:`modelplex_replica.statedict`).

Two request shapes, batched together:

- native JSON: ``{"inputs": [x1, x2, ...]}`` (one row) or ``{"inputs": [[...], [...]]}`` (several
  rows), answered ``{"outputs": [...]}`` with the same nesting;
- Open Inference Protocol: an :class:`~modelplex.wire.oip.InferRequest` whose tensors (first
  dimension = batch) are the module's positional arguments, answered with named outputs.

Requests for the same model whose tensors agree in dtype and trailing shape are concatenated
into one forward pass, whichever protocol they came by.

Model metadata (OIP ``GET /v2/models/M``) comes from a ``modelplex.json`` file saved in the
TorchScript archive (``torch.jit.save(m, f, _extra_files={"modelplex.json": ...})`` with
``{"inputs": [{"name", "datatype", "shape"}], "outputs": [...]}``; for safetensors the same
JSON under the file metadata's ``modelplex.json`` key), else from the module: input
names from ``forward``'s signature, widths from its first and last ``Linear`` layers, the
datatype of its parameters, and ``-1`` for dimensions it cannot know (the batch).

OIP inputs are checked against that metadata before they reach the model (as Triton does):
an unknown or missing input name, another datatype, or a shape that differs where the
metadata gives a size (``-1``: any) is a 400 naming the input, what was expected and what came.
Inspected metadata is checked where it is certain: names from ``forward``'s signature, the
datatype and width only when the module's first layer with weights is a ``Linear``. A model
that still rejects its inputs answers 400 with the cause (the last line of TorchScript's error).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping

import numpy as np
import torch

from modelplex import batch, get_multiplexed_model_id, multiplexed
from modelplex.cache import LoadContext, current_load
from modelplex.runtime import current_runtime
from modelplex.wire.errors import BadRequest, ModelLoadError
from modelplex.wire.names import ENV_WARM_DIR
from modelplex.wire.oip import DTYPES, InferRequest, InferResponse, datatype_of, tensor_metadata
from modelplex_replica import statedict
from modelplex_replica.sources import ModelSource, anonymous_file, fd_path
from modelplex_replica.warm import DiskTier, copy_file

#: The archive entry that declares a model's OIP inputs and outputs.
METADATA_FILE = "modelplex.json"
PLATFORMS = {"torchscript": "pytorch_torchscript", "safetensors": "pytorch_safetensors"}


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class LoadedModel:
    module: torch.nn.Module  # a ScriptModule for TorchScript files
    inputs: tuple[dict, ...]  # OIP tensor metadata
    outputs: tuple[dict, ...]
    #: What requests are checked against: input names (None: not known), and per input its
    #: datatype and shape (None: not known).
    checks: tuple[dict, ...] | None = None

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]


@dataclass
class _Work:
    """One request's share of a batch: its tensors (batch dimension first) and how to answer."""

    index: int
    tensors: tuple[torch.Tensor, ...]
    request: Any  # the native body or the InferRequest
    single: bool = False  # a native one-row request: answer without the batch dimension


class TorchScriptHandler:
    """Serves the model files found at ``modelSource.uri``: ``torch.jit.save``-d modules, or
    (``model_format="safetensors"``) state_dicts put into ``module_class(**module_kwargs)``."""

    def __init__(self, source_uri: str, base_dir: Path | None = None, *, model_format: str = "torchscript",
                 module_class: Callable[..., Any] | None = None, module_kwargs: Mapping[str, Any] | None = None):
        if model_format not in PLATFORMS:
            raise ValueError(f"model format must be one of {', '.join(PLATFORMS)} (got {model_format!r})")
        if model_format == "safetensors" and module_class is None:
            raise ValueError("format safetensors needs the module class its state_dicts go into")
        self.source = ModelSource(source_uri, base_dir=base_dir)
        self.format = model_format
        self.module_class = module_class
        self.module_kwargs = dict(module_kwargs or {})
        self.device = pick_device()
        # One forward pass at a time: torch already uses every intra-op thread for one batch.
        self._compute = threading.Lock()
        self._disk: DiskTier | None = None

    @multiplexed
    async def load_model(self, model_id: str) -> LoadedModel:
        load = current_load()
        path = self.source.local_path(model_id)
        if path is not None:
            # A local file never passes through Python bytes: safetensors is mapped where it
            # lies, TorchScript read by torch itself (from bytes, its load held the GIL five
            # times as long: bench/swap/profile_load.py). The disk tier is for remote sources.
            try:
                nbytes = path.stat().st_size
            except FileNotFoundError:
                raise self.source.missing(model_id) from None
            if load is not None:
                await load.expect(nbytes)
            return await asyncio.to_thread(self._load_file, model_id, path)
        return await self._load_remote(model_id, self._disk_tier(), load)

    async def _load_remote(self, model_id: str, disk: DiskTier | None, load: LoadContext | None) -> LoadedModel:
        """A model from http(s) or s3 through a file, never a Python buffer: fetched into an
        anonymous file (in memory on Linux, :meth:`ModelSource.fetch_file`) or opened in the disk
        tier, then loaded by path as a ``file:`` model is: safetensors mapped, TorchScript read
        by torch (from a buffer, ``torch.jit.load`` copies it three more times holding the GIL:
        1.9-2.8x a plain download over loopback, by path 0.8-1.1x: bench/results/swap-2026-11-28b)."""
        file = await asyncio.to_thread(self._open_warm, disk, model_id) if disk is not None else None
        fetched = file is None
        if file is None:
            file = await self.source.fetch_file(model_id)
        elif load is not None:
            load.tier = "warm"
        try:
            if load is not None:
                await load.expect(os.fstat(file.fileno()).st_size)
        except BaseException:
            file.close()
            raise
        # The worker thread closes the file, after torch has opened it by its descriptor's path:
        # closed here on a cancellation, the number could name another load's file by then.
        return await asyncio.to_thread(self._load_open_file, model_id, file, disk if fetched else None)

    def _open_warm(self, disk: DiskTier, model_id: str) -> IO[bytes] | None:
        """The disk tier's copy, opened (None: not there). A safetensors model maps its file for as
        long as it is loaded, so it gets a copy in an anonymous file: mapped, a tier file that the
        tier then drops would keep its disk (the tier's volume is sized for ``hostCacheBytes``)."""
        file = disk.open(model_id)
        if file is None or self.format != "safetensors":
            return file
        with file:
            copy = anonymous_file()
            try:
                copy_file(file, copy, os.fstat(file.fileno()).st_size)
            except OSError:
                copy.close()
                return None  # unreadable (as DiskTier.read treats it): fetched again
            return copy

    def _load_open_file(self, model_id: str, file: IO[bytes], keep_in: DiskTier | None) -> LoadedModel:
        with file:  # a mapped safetensors model keeps its pages after the file is closed
            loaded = self._load_file(model_id, Path(fd_path(file)))
            if keep_in is not None:  # only a file that loaded is kept
                keep_in.write_from(model_id, file)
        return loaded

    def _disk_tier(self) -> DiskTier | None:
        """On CPU, the warm tier: a local copy of each fetched file (``hostCacheBytes``)."""
        budget = current_runtime().host_cache_bytes
        if self.device.type != "cpu" or not budget:
            return None
        if self._disk is None:
            self._disk = DiskTier(budget, os.environ.get(ENV_WARM_DIR) or None)
            weakref.finalize(self, self._disk.close)
        return self._disk

    def _load_file(self, model_id: str, path: Path) -> LoadedModel:
        if self.format == "torchscript":
            return self._torchscript(model_id, str(path))
        try:
            tensors, declared = statedict.read_file(model_id, path)
        except FileNotFoundError:
            raise self.source.missing(model_id) from None
        return self._from_state_dict(model_id, tensors, declared)

    def _from_state_dict(self, model_id: str, tensors: dict[str, torch.Tensor], declared: str) -> LoadedModel:
        assert self.module_class is not None  # (format safetensors: checked when built)
        module = statedict.build_module(model_id, self.module_class, self.module_kwargs, tensors)
        return _loaded(model_id, module.to(self.device), declared)

    def _torchscript(self, model_id: str, source: str) -> LoadedModel:
        extra = {METADATA_FILE: ""}
        try:
            with warnings.catch_warnings():
                # TorchScript is deprecated upstream in favour of torch.export, but it is the
                # format this handler serves; the warning would repeat on every load.
                warnings.simplefilter("ignore", FutureWarning)
                module = torch.jit.load(source, map_location=self.device, _extra_files=extra)
        except Exception as error:  # noqa: BLE001 - torch raises many kinds
            raise ModelLoadError(f"model {model_id!r} is not a TorchScript file: {error}") from None
        return _loaded(model_id, module.eval(), extra[METADATA_FILE])

    async def oip_metadata(self, model_id: str) -> dict:
        """OIP model metadata: loads the model (so a model that answers here is servable)."""
        model = await self.load_model(model_id)
        return {"name": model_id, "versions": ["1"], "platform": PLATFORMS[self.format],
                "inputs": list(model.inputs), "outputs": list(model.outputs)}

    @batch
    async def __call__(self, requests: list[Any]) -> list[Any]:
        model = await self.load_model(get_multiplexed_model_id())
        results: list[Any] = [None] * len(requests)
        groups: dict[tuple, list[_Work]] = {}
        for index, body in enumerate(requests):
            try:
                work = _oip_work(index, body, model) if isinstance(body, InferRequest) else _native_work(index, body)
            except BadRequest as error:
                results[index] = error
                continue
            signature = tuple((t.dtype, tuple(t.shape[1:])) for t in work.tensors)
            groups.setdefault(signature, []).append(work)
        for works in groups.values():
            try:
                outputs = await asyncio.to_thread(self._forward, model.module, works)
            except BadRequest as error:
                for work in works:
                    results[work.index] = error
                continue
            start = 0
            for work in works:
                stop = start + work.tensors[0].shape[0]
                results[work.index] = _answer(work, model, [o[start:stop] for o in outputs])
                start = stop
        return results

    def _forward(self, module: torch.nn.Module, works: list[_Work]) -> list[np.ndarray]:
        with self._compute, torch.inference_mode():
            arguments = [torch.cat([w.tensors[i] for w in works]).to(self.device) for i in range(len(works[0].tensors))]
            try:
                result = module(*arguments)
            except RuntimeError as error:
                raise BadRequest(f"the model rejected the inputs: {model_error_cause(error)}") from None
        results = result if isinstance(result, (tuple, list)) else (result,)
        if not all(isinstance(r, torch.Tensor) for r in results):
            raise BadRequest("the model returned something other than tensors")
        return [r.cpu().numpy() for r in results]


def _loaded(model_id: str, module: torch.nn.Module, declared_text: str) -> LoadedModel:
    """The model with its OIP metadata: declared in the file, else inspected from the module."""
    declared = _declared_metadata(model_id, declared_text)
    if declared is not None:
        return LoadedModel(module, declared[0], declared[1], checks=declared[0])
    inputs, outputs, checks = _inspect_metadata(module)
    return LoadedModel(module, inputs, outputs, checks=checks)


def _native_work(index: int, body: Any) -> _Work:
    if not isinstance(body, dict) or "inputs" not in body:
        raise BadRequest('body must be a JSON object {"inputs": [...]}')
    try:
        tensor = torch.tensor(body["inputs"], dtype=torch.float32)
    except (TypeError, ValueError) as error:
        raise BadRequest(f"inputs must be a list of numbers or of equal-length lists: {error}") from None
    if tensor.dim() == 1:
        return _Work(index, (tensor.unsqueeze(0),), body, single=True)
    if tensor.dim() == 2 and tensor.shape[0] > 0:
        return _Work(index, (tensor,), body)
    raise BadRequest(f"inputs must be one row or a list of rows (got shape {list(tensor.shape)})")


def model_error_cause(error: BaseException) -> str:
    """The last meaningful line of a model's error: TorchScript puts its cause last, after a
    header ("The following operation failed...") and a traceback that names server paths."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    meaningful = [line for line in lines if not line.startswith(("File ", "~", "^")) and "<--- HERE" not in line]
    return (meaningful or lines or [type(error).__name__])[-1]


def check_inputs(request: InferRequest, checks: tuple[dict, ...] | None) -> None:
    """400 naming the input when ``request`` does not match the model's metadata (see the module doc)."""
    if checks is None:
        return
    expected = {check["name"]: check for check in checks}
    for name, array in request.inputs.items():
        check = expected.get(name)
        if check is None:
            raise BadRequest(f"unknown input {name!r}: the model takes {sorted(expected)}")
        got = _datatype(array)
        if check["datatype"] is not None and got != check["datatype"]:
            raise BadRequest(f"input {name!r}: expected datatype {check['datatype']}, got {got}")
        shape = check["shape"]
        if shape is not None and (len(shape) != array.ndim
                                  or any(want not in (-1, have) for want, have in zip(shape, array.shape))):
            raise BadRequest(f"input {name!r}: expected shape {shape} (-1: any size), got {list(array.shape)}")
    missing = [name for name in expected if name not in request.inputs]
    if missing:
        raise BadRequest(f"missing input {missing[0]!r}: the model takes {sorted(expected)}")


def _datatype(array: np.ndarray) -> str:
    try:
        return datatype_of(array)
    except ValueError:
        return str(array.dtype)


def _oip_work(index: int, request: InferRequest, model: LoadedModel) -> _Work:
    if not request.inputs:
        raise BadRequest("the request has no inputs")
    check_inputs(request, model.checks)
    tensors = []
    for name, array in request.inputs.items():
        if array.dtype == object:
            raise BadRequest(f"input {name!r}: a TorchScript model takes numeric tensors, not BYTES")
        if array.ndim == 0 or array.shape[0] == 0:
            raise BadRequest(f"input {name!r}: the first dimension is the batch and must be >= 1 "
                             f"(got shape {list(array.shape)})")
        tensors.append(torch.from_numpy(array))
    rows = {t.shape[0] for t in tensors}
    if len(rows) > 1:
        raise BadRequest(f"every input needs the same batch size (got {sorted(rows)})")
    return _Work(index, tuple(tensors), request)


def _answer(work: _Work, model: LoadedModel, outputs: list[np.ndarray]) -> Any:
    if isinstance(work.request, InferRequest):
        names = model.output_names + [f"output{i}" for i in range(len(model.outputs), len(outputs))]
        return InferResponse(dict(zip(names, outputs)))
    first = outputs[0]
    return {"outputs": first[0] if work.single else first}


def _declared_metadata(model_id: str, text: str) -> tuple[tuple[dict, ...], ...] | None:  # (inputs, outputs)
    if not text:
        return None
    try:
        document = json.loads(text)
        declared = tuple(tuple(tensor_metadata(t["name"], t["datatype"], t["shape"]) for t in document[side])
                         for side in ("inputs", "outputs"))
    except (ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"model {model_id!r}: {METADATA_FILE} must hold inputs and outputs, each a list of "
                             f"{{name, datatype, shape}}: {error!r}") from None
    for tensor in declared[0] + declared[1]:
        if tensor["datatype"] not in DTYPES:
            raise ModelLoadError(f"model {model_id!r}: {METADATA_FILE}: unknown datatype {tensor['datatype']!r}")
    return declared


def _inspect_metadata(module: torch.nn.Module) -> tuple[tuple[dict, ...], tuple[dict, ...], tuple[dict, ...] | None]:
    """(inputs, outputs) as reported, and the checks that are certain (None: names unknown)."""
    names = _input_names(module)
    named = names is not None
    names = names or ["input0"]
    parameter = next((p for p in module.parameters() if p.is_floating_point()), None)
    datatype = datatype_of(np.empty(0, dtype=str(parameter.dtype).removeprefix("torch."))) if parameter is not None \
        else "FP32"
    linears: list[Any] = [m for m in module.modules() if _is_linear(m)]  # scripted: attributes untyped
    # The input is the first Linear's only when it is the first layer with weights (an
    # Embedding first takes integer ids of any width).
    weighted = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
    linear_first = bool(weighted) and _is_linear(weighted[0]) and len(names) == 1
    width_in = int(linears[0].weight.shape[1]) if linear_first else -1
    width_out = int(linears[-1].weight.shape[0]) if linears else -1
    inputs = tuple(tensor_metadata(name, datatype, [-1, width_in] if width_in > 0 else [-1]) for name in names)
    outputs = (tensor_metadata("output0", datatype, [-1, width_out] if width_out > 0 else [-1]),)
    checks = tuple({"name": t["name"], "datatype": t["datatype"] if linear_first else None,
                    "shape": t["shape"] if linear_first else None} for t in inputs) if named else None
    return inputs, outputs, checks


def _input_names(module: torch.nn.Module) -> list[str] | None:
    """``forward``'s positional parameters: from the schema of a scripted module, the signature of
    an eager one (safetensors); None where they are not known (``*args``, no schema)."""
    if isinstance(module, torch.jit.ScriptModule):
        try:
            return [a.name for a in module.forward.schema.arguments[1:]]  # type: ignore[attr-defined]  # [0] is self; torch types a ScriptMethod as a plain callable
        except (AttributeError, RuntimeError):
            return None
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if not parameters or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                     inspect.Parameter.POSITIONAL_OR_KEYWORD)] or None


def _is_linear(module: torch.nn.Module) -> bool:
    """A ``Linear`` layer, eager or scripted (a scripted submodule keeps only its class's name)."""
    return isinstance(module, torch.nn.Linear) or getattr(module, "original_name", "") == "Linear"
