"""The benchmark's handler classes for Modelplex: ``handlers.build`` with the ``modelplex`` SDK.

Manifests name them as ``handler: "mp_handlers:BatchedMLP"`` (this folder is on the
replicas' import path).
"""

from handlers import build

import modelplex

_classes = build(modelplex)
MLP = _classes.MLP
BatchedMLP = _classes.BatchedMLP
BatchedEcho = _classes.BatchedEcho
GPUBatchedMLP = _classes.GPUBatchedMLP
Multiplexed = _classes.Multiplexed
Streamer = _classes.Streamer
BusyMLP = _classes.BusyMLP
BusyStreamer = _classes.BusyStreamer
