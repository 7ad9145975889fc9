"""The built-in handler: one TorchScript file per model id, batched forward passes.

Request body: ``{"inputs": [x1, x2, ...]}`` (one row) or ``{"inputs": [[...], [...]]}``
(several rows). Response: ``{"outputs": [...]}`` with the same nesting. Rows from several
requests for the same model are stacked into one forward pass.
"""

from __future__ import annotations

import asyncio
import io
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from modelplex import batch, get_multiplexed_model_id, multiplexed
from modelplex.errors import BadRequest, ModelLoadError
from modelplex_replica.sources import ModelSource


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TorchScriptHandler:
    """Serves ``torch.jit.save``-d modules found at ``modelSource.uri``."""

    def __init__(self, source_uri: str, base_dir: Path | None = None):
        self.source = ModelSource(source_uri, base_dir=base_dir)
        self.device = pick_device()
        # One forward pass at a time: torch already uses every intra-op thread for one batch.
        self._compute = threading.Lock()

    @multiplexed
    async def load_model(self, model_id: str) -> torch.jit.ScriptModule:
        data = await self.source.fetch(model_id)
        return await asyncio.to_thread(self._deserialize, model_id, data)

    def _deserialize(self, model_id: str, data: bytes) -> torch.jit.ScriptModule:
        try:
            with warnings.catch_warnings():
                # TorchScript is deprecated upstream in favour of torch.export, but it is the
                # format this handler serves; the warning would repeat on every load.
                warnings.simplefilter("ignore", FutureWarning)
                module = torch.jit.load(io.BytesIO(data), map_location=self.device)
        except Exception as error:  # noqa: BLE001 - torch raises many kinds
            raise ModelLoadError(f"model {model_id!r} is not a TorchScript file: {error}") from None
        return module.eval()

    @batch
    async def __call__(self, requests: list[Any]) -> list[Any]:
        model = await self.load_model(get_multiplexed_model_id())
        rows, spans, results = [], [], [None] * len(requests)
        for index, body in enumerate(requests):
            try:
                tensor, single = _parse(body)
            except BadRequest as error:
                results[index] = error
                continue
            spans.append((index, len(rows), len(rows) + tensor.shape[0], single))
            rows.extend(tensor)
        if rows:
            outputs = await asyncio.to_thread(self._forward, model, rows)
            outputs = outputs.numpy()  # serialized natively by the replica's JSON writer
            for index, start, stop, single in spans:
                results[index] = {"outputs": outputs[start] if single else outputs[start:stop]}
        return results

    def _forward(self, model: torch.jit.ScriptModule, rows: list[torch.Tensor]) -> torch.Tensor:
        with self._compute, torch.inference_mode():
            try:
                return model(torch.stack(rows).to(self.device)).cpu()
            except RuntimeError as error:
                raise BadRequest(f"the model rejected the inputs: {str(error).splitlines()[0]}") from None


def _parse(body: Any) -> tuple[torch.Tensor, bool]:
    if not isinstance(body, dict) or "inputs" not in body:
        raise BadRequest('body must be a JSON object {"inputs": [...]}')
    try:
        tensor = torch.tensor(body["inputs"], dtype=torch.float32)
    except (TypeError, ValueError) as error:
        raise BadRequest(f"inputs must be a list of numbers or of equal-length lists: {error}") from None
    if tensor.dim() == 1:
        return tensor.unsqueeze(0), True
    if tensor.dim() == 2 and tensor.shape[0] > 0:
        return tensor, False
    raise BadRequest(f"inputs must be one row or a list of rows (got shape {list(tensor.shape)})")
