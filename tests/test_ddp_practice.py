"""Tests for forge_course.reference.ddp_practice and .fsdp: one torchrun launch, with a restart."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DistributedSampler

from forge_course.reference.collectives import memory_per_rank
from forge_course.reference.ddp_practice import padded_positions
from tests.test_ddp import TORCHRUN, _run


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_the_mask_keeps_every_example_once(world_size, shuffle):
    for n in range(1, 14):
        kept, padded = [], 0
        for rank in range(world_size):
            sampler = DistributedSampler(range(n), world_size, rank, shuffle=shuffle, seed=3)
            mask = padded_positions(n, world_size, rank)
            assert len(mask) == len(sampler)
            kept += [i for i, pad in zip(sampler, mask.tolist(), strict=True) if not pad]
            padded += int(mask.sum())
        assert sorted(kept) == list(range(n))
        assert padded == len(sampler) * world_size - n


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("practice")
    # The environment variable: see the chapter; without it a restarted gloo group of torch
    # 2.13 fails to connect or hangs.
    command = [*TORCHRUN, "--max-restarts=1", "-m", "forge_course.reference.ddp_practice"]
    done, left_behind = _run(
        [*command, "--out-dir", str(out)],
        timeout=180,
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert left_behind == []
    assert "rank 1 crashes on purpose after step 4" in done.stderr
    return (
        json.loads((out / "practice.json").read_text()),
        json.loads((out / "resume.json").read_text()),
    )


@pytest.mark.slow
def test_no_sync_all_reduces_once_and_gives_the_same_gradient(launched):
    acc = launched[0]["accumulate"]
    assert acc["all_reduces"] == {"synced": 4, "no_sync": 1} and acc["ranks_identical"]
    assert acc["max_abs_diff"] <= 1e-6 * acc["largest_gradient"]
    assert acc["max_abs_diff_whole_batch"] <= 1e-6 * acc["largest_gradient"]


@pytest.mark.slow
def test_a_rank0_checkpoint_loads_identically_everywhere(launched):
    ckpt = launched[0]["checkpoint"]
    assert ckpt["ddp_keys"] == ["module.0.weight", "module.0.bias"]
    assert ckpt["module_keys"] == ["0.weight", "0.bias"]
    assert ckpt["bare_load_error"].startswith("Missing key(s)") and ckpt["prefix_stripped_loads"]
    assert not ckpt["identical_before_load"] and ckpt["identical_after_load"]
    assert ckpt["equal_to_trained"]


@pytest.mark.slow
def test_the_fixed_evaluations_count_each_example_once(launched):
    ev = launched[0]["evaluate"]
    single = ev["single process"]
    assert (ev["padded_to"], ev["naive"]["examples"], single["examples"]) == (12, 12, 11)
    assert ev["naive"]["accuracy"] == 4 / 12 and single["accuracy"] == 4 / 11
    for way in ("masked", "gathered"):
        assert ev[way]["examples"] == 11 and ev[way]["accuracy"] == single["accuracy"]
        assert abs(ev[way]["loss"] - single["loss"]) <= ev["per_example_max_diff"] < 1e-6


@pytest.mark.slow
def test_the_restarted_run_ends_where_the_uncrashed_one_does(launched):
    resume = launched[1]
    assert resume["attempt"] == 1 and resume["resumed_from_step"] == 4 and resume["steps"] == 6
    assert resume["equal_to_uncrashed"] and resume["ranks_identical"]
    assert resume["checkpoints"] == [f"step-{step:08d}.pt" for step in range(1, 7)]


@pytest.mark.slow
def test_fsdp2_shards_by_rows_matches_ddp_and_reloads(launched):
    fsdp = launched[0]["fsdp"]
    calc = memory_per_rank(fsdp["n_params"], 2, stage=3, bytes_optimizer=4)
    assert fsdp["n_params"] == sum(torch.Size(full).numel() for full, _ in fsdp["shapes"].values())
    for kind, key in (("weights", "params"), ("grads", "grads"), ("momentum", "optimizer")):
        assert [held[kind] for held in fsdp["bytes"]] == [29 * 4, 20 * 4]
        assert sum(held[kind] for held in fsdp["bytes"]) == 2 * calc[key]
    assert fsdp["inside_forward"] == [8, 4] and fsdp["after_forward"] == [4, 4]
    assert fsdp["max_abs_diff_ddp"] == 0.0 and fsdp["loaded_equal"]
    assert sorted(fsdp["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert fsdp["chunks_of_0.weight"] == [
        {"offsets": [0, 0], "sizes": [4, 4]},
        {"offsets": [4, 0], "sizes": [4, 4]},
    ]


@pytest.mark.slow
def test_the_ddp_demo_runs_on_the_launchs_own_group(launched):
    # ddp_worker joins no group of its own when its caller has one, and leaves that group be.
    summary = launched[0]["ddp"]
    assert summary["ok"] and summary["ranks_identical"] and summary["backend"] == "gloo"
    assert summary["max_abs_diff"] <= 1e-6 and summary["world_size"] == 2
