"""Model sizes as the replica measures them, and the warm tiers (host memory, disk copy)."""

import asyncio
import tempfile
from dataclasses import dataclass

import torch

from modelplex.runtime import Runtime
from modelplex.wire.spec import parse_spec
from modelplex_replica.handler import configure_cache
from modelplex_replica.sizes import ModelSizer, device_memory_bytes, tensor_bytes
from modelplex_replica.warm import DiskTier, HostTier, _tensors, to_device, to_host


def mlp(width=256):
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 8))


def expected_bytes(width=256):
    floats = width * width + width + 2 * width + 2 * width + 8 * width + 8  # linears, bn weight/bias + stats
    return floats * 4 + 8  # + num_batches_tracked (int64)


@dataclass(frozen=True)
class Loaded:
    module: torch.nn.Module
    labels: tuple


def test_a_module_is_its_parameters_and_buffers():
    assert tensor_bytes(mlp()) == expected_bytes()


def test_a_scripted_module_in_a_dataclass_is_found():
    scripted = torch.jit.script(mlp())
    assert tensor_bytes(Loaded(scripted, ("a", "b"))) == expected_bytes()


def test_tied_weights_count_once():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 64), torch.nn.Linear(64, 100, bias=False))
    model[1].weight = model[0].weight
    assert tensor_bytes(model) == 100 * 64 * 4


def test_a_model_without_tensors_has_no_size():
    assert tensor_bytes({"vocabulary": ["a", "b"]}) is None
    assert ModelSizer(torch.device("cpu")).size("m", object()) is None


def test_on_cpu_the_sizer_measures_tensors():
    sizer = ModelSizer(torch.device("cpu"))
    sizer.load_started("m")
    assert sizer.size("m", {"encoder": mlp(), "head": mlp(64)}) == expected_bytes() + expected_bytes(64)


def test_the_spec_configures_the_cache_and_a_memory_fraction_is_a_share_of_the_device():
    runtime = Runtime()
    configure_cache(parse_spec({"image": "x", "handler": "m:C", "maxOngoingRequests": 7,
                                "multiplexing": {"memoryFraction": 0.25, "evictionPolicy": "lfu"}}), runtime)
    assert runtime.max_model_bytes == int(device_memory_bytes(torch.device("cpu")) * 0.25) > 0
    assert runtime.eviction_policy == "lfu" and runtime.max_waiting_per_model == 7
    assert runtime.max_concurrent_loads == 3 and runtime.load_timeout_s == 300
    assert runtime.warm_tier is None  # no GPU here: the warm tier is the loader's disk copy


async def test_the_host_tier_keeps_models_within_its_bytes_and_drops_the_oldest():
    released = []

    class Unloadable(torch.nn.Linear):
        def unload(self):
            released.append(self)

    tier = HostTier(3000, torch.device("cpu"))
    a, b = Unloadable(10, 10), Unloadable(10, 10)
    assert await tier.keep("a", a, 1500) and await tier.keep("b", b, 1500)
    assert await tier.keep("c", Unloadable(10, 10), 1000)  # a goes to make room
    assert released == [a] and not tier.holds("a") and tier.holds("b")
    assert not await tier.keep("huge", Unloadable(10, 10), 4000)
    assert not await tier.keep("no-tensors", {"rules": []}, 10)
    assert await tier.take("b") is b and not tier.holds("b")
    assert await tier.take("b") is None
    await tier.close()
    assert len(released) == 2 and tier.bytes_used == 0


def _keep(tier: DiskTier, model_id: str, data: bytes) -> bool:
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.flush()
        return tier.write_from(model_id, file)


def _read(tier: DiskTier, model_id: str) -> bytes | None:
    file = tier.open(model_id)
    if file is None:
        return None
    with file:
        return file.read()


def test_the_disk_tier_keeps_copies_within_its_bytes(tmp_path):
    tier = DiskTier(250, tmp_path / "tier")
    assert _keep(tier, "org/model:v1", b"a" * 100) and _keep(tier, "b", b"b" * 100)
    assert _read(tier, "org/model:v1") == b"a" * 100  # now the most recently used
    assert _keep(tier, "c", b"c" * 100)  # b goes
    assert _read(tier, "b") is None and _read(tier, "c") == b"c" * 100
    assert not _keep(tier, "huge", b"x" * 300)
    assert tier.bytes_used == 200 and len(list((tmp_path / "tier").iterdir())) == 2


def test_the_disk_tier_removes_its_own_folder():
    tier = DiskTier(100)
    _keep(tier, "a", b"1")
    tier.close()
    assert not tier.directory.exists()


async def test_disk_tier_writes_from_many_threads_stay_within_bytes(tmp_path):
    tier = DiskTier(1000, tmp_path)
    await asyncio.gather(*(asyncio.to_thread(_keep, tier, f"m{i}", b"x" * 300) for i in range(20)))
    files = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert sum(p.stat().st_size for p in files) <= 1000 and tier.bytes_used <= 1000


def test_moving_a_models_tensors_keeps_the_modules_and_moves_tied_weights_once():
    torch.manual_seed(0)
    encoder, decoder = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    decoder.weight = encoder.weight  # tied
    model = torch.nn.Sequential(encoder, decoder)
    before = model(torch.tensor([1, 2]))
    to_host([model, decoder])  # a module found twice, a tensor shared by two modules
    to_device([model, decoder], torch.device("cpu"))
    assert decoder.weight is encoder.weight
    assert torch.equal(model(torch.tensor([1, 2])), before)
    assert len(_tensors([model, decoder])) == 1


def test_the_disk_tier_keeps_a_copy_of_an_open_file_and_opens_it_even_once_dropped(tmp_path):
    tier = DiskTier(250, tmp_path)
    source = tmp_path.parent / "fetched.bin"
    source.write_bytes(b"w" * 200)
    with open(source, "rb", buffering=0) as file:
        assert tier.write_from("m", file)
    with tmp_path.parent.joinpath("big.bin").open("w+b") as big:
        big.write(b"x" * 300)
        big.flush()
        assert not tier.write_from("big", big)  # larger than the whole tier
    held = tier.open("m")
    assert held is not None and tier.open("absent") is None
    with held:
        assert _keep(tier, "n", b"n" * 100)  # m goes, while it is open
        assert tier.open("m") is None
        assert held.read() == b"w" * 200
