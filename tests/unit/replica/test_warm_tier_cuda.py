"""The GPU warm tier on a real GPU: an evicted model waits in pinned host memory and comes back
by copy on the tier's own stream, the same module object answering as before. Deselected where
torch sees no GPU (tests/conftest.py); ``bench/gpu/run.sh`` runs it on a GPU machine."""

import warnings

import pytest
import torch

from modelplex_replica.warm import HostTier

pytestmark = pytest.mark.cuda


def models() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.BatchNorm1d(8)).eval())
    return [eager.eval(), scripted]


@pytest.mark.parametrize("index", [0, 1], ids=["eager", "scripted"])
async def test_a_model_waits_pinned_and_comes_back_on_the_device_answering_the_same(index):
    device = torch.device("cuda")
    model = models()[index].to(device)
    x = torch.randn(4, 64, device=device)
    with torch.inference_mode():
        before = model(x).cpu()
    tier = HostTier(1 << 30, device)
    assert await tier.keep("m", model, 1 << 20)
    tensors = [*model.parameters(), *model.buffers()]
    assert all(t.device.type == "cpu" and t.is_pinned() for t in tensors)
    back = await tier.take("m")
    assert back is model  # the same object: scripted state kept
    assert all(t.device == torch.device("cuda", torch.cuda.current_device()) for t in tensors)
    with torch.inference_mode():
        assert torch.equal(back(x).cpu(), before)
    await tier.close()


async def test_the_copy_back_runs_on_the_tiers_own_stream_not_the_serving_one():
    device = torch.device("cuda")
    model = torch.nn.Linear(1024, 1024).to(device)
    tier = HostTier(1 << 30, device)
    assert await tier.keep("m", model, 4 << 20)
    await tier.take("m")
    stream = tier._stream
    assert stream is not None and stream != torch.cuda.current_stream(device)
    await tier.close()
