"""Build a small zoo of TorchScript MLPs (same shape, different seeds) for the examples.

    python examples/zoo/build_zoo.py [--count 20] [--out examples/zoo/models]

Each model is ``<out>/model-NN.pt``; ``deployment.yaml`` serves them by id (``model-07``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

warnings.filterwarnings("ignore", category=FutureWarning)  # TorchScript's deprecation notice

HERE = Path(__file__).resolve().parent
IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 64, 4


def make_mlp(seed: int) -> torch.jit.ScriptModule:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_FEATURES)
    )
    return torch.jit.script(model.eval())


def build_zoo(out: Path, count: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = out / f"model-{index:02d}.pt"
        if not path.exists():
            torch.jit.save(make_mlp(seed=index), str(path))
        paths.append(path)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--out", type=Path, default=HERE / "models")
    args = parser.parse_args()
    started = time.monotonic()
    paths = build_zoo(args.out, args.count)
    print(f"zoo: {len(paths)} TorchScript MLPs ({IN_FEATURES}->{HIDDEN}->{HIDDEN}->{OUT_FEATURES}) in {args.out} "
          f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
