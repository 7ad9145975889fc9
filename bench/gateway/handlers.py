"""The bench's handler, as a user writes it: an OIP request's tensors summed, one small answer
back (the bench measures carrying the request's bytes, not computing on them)."""

from __future__ import annotations

import numpy as np

from modelplex.wire.oip import InferRequest


class Sum:
    async def __call__(self, body: InferRequest):
        return {"sum": np.array([float(sum(int(a.sum()) for a in body.inputs.values()))])}
