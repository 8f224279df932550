"""The profiling references, against PyTorch's own profiler and DataLoader."""

import os

import pytest
import torch
from torch.profiler import profile, record_function
from torch.utils.data import DataLoader

from forge_course.data.decoding import DecodingDataset
from forge_course.reference import profiling


def _dataset(n=23, features=3, latency_s=0.0):
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(n, features, generator=gen)
    return DecodingDataset(inputs, torch.randint(0, 3, (n,), generator=gen), latency_s)


def test_decoding_gives_back_the_tensors_and_counts_every_read():
    dataset = _dataset()
    x, y = dataset[4]
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and y.dim() == 0
    gen = torch.Generator().manual_seed(0)
    torch.testing.assert_close(x, torch.randn(23, 3, generator=gen)[4], rtol=0, atol=0)
    dataset[4]
    assert dataset.decoded == 2


def test_preload_gives_the_same_batches_as_the_decoding_dataset_with_one_read_each():
    dataset = _dataset()
    loaders = [
        DataLoader(d, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(1))
        for d in (dataset, profiling.preload(dataset))
    ]
    assert dataset.decoded == len(dataset)
    for _ in range(2):
        for (x, y), (px, py) in zip(*loaders, strict=True):
            assert torch.equal(x, px) and torch.equal(y, py)
    assert dataset.decoded == 3 * len(dataset)  # only the decoding loader's two epochs read


def _profile_with_phases():
    model = torch.nn.Linear(64, 64)
    with profiling.quiet_profiler(), profile() as prof:
        for _ in range(3):
            with record_function("data"):
                x = torch.randn(256, 64)
            with record_function("forward"):
                loss = model(x).square().mean()
            with record_function("backward"):
                loss.backward()
    return prof.key_averages()


def test_phase_ms_and_bottleneck_agree_with_the_profilers_rows():
    averages = _profile_with_phases()
    times = profiling.phase_ms(averages, ["data", "forward", "backward"])
    rows = {r.key: r for r in averages}
    for phase, ms in times.items():
        assert rows[phase].count == 3
        assert ms == pytest.approx(rows[phase].cpu_time_total / 1e3)
        assert rows[phase].self_cpu_time_total < rows[phase].cpu_time_total  # rows nest
    name, share = profiling.bottleneck(averages, ["data", "forward", "backward"])
    assert times[name] == max(times.values())
    assert share == pytest.approx(times[name] / sum(times.values()))


def test_a_phase_missing_from_the_profile_counts_as_no_time():
    averages = _profile_with_phases()
    times = profiling.phase_ms(averages, ["data", "optimizer"])
    assert times["optimizer"] == 0.0
    assert profiling.bottleneck(averages, ["data", "optimizer"]) == ("data", 1.0)


def test_quiet_profiler_keeps_the_notices_off_stderr_and_passes_the_rest(capfd):
    with profiling.quiet_profiler(), profile(profile_memory=True):
        torch.zeros(1000).sum()
        os.write(2, b"a line that is not the profiler's\n")
    err = capfd.readouterr().err
    assert "profiler_st" not in err and "before the profiling started" not in err
    assert "a line that is not the profiler's" in err


def test_timed_ms_measures_the_call():
    import time

    assert profiling.timed_ms(lambda: time.sleep(0.01), torch.device("cpu")) >= 10.0
