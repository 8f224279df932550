"""Tests for forge_course.reference.ddp: DDP ranks end where one process does, and never hang."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, DistributedSampler

from forge_course.device import tolerance
from forge_course.reference.ddp import (
    _first_failure,
    gradient_scaling,
    make_dataset,
    run_demo,
    single_process_reference,
)

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
SPAWN = [sys.executable]
DEMO = ["-m", "forge_course.reference.ddp"]


def test_rank_shards_make_up_each_global_batch():
    dataset = make_dataset(steps=3, global_batch=12)
    whole = DataLoader(
        dataset, batch_size=12, sampler=DistributedSampler(dataset, 1, 0, shuffle=True, seed=4)
    )
    shards = [
        DataLoader(
            dataset, batch_size=4, sampler=DistributedSampler(dataset, 3, r, shuffle=True, seed=4)
        )
        for r in range(3)
    ]
    for (x, _), *parts in zip(whole, *shards, strict=True):
        rows = torch.cat([part_x for part_x, _ in parts])
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, x.tolist()))


def test_the_reference_depends_on_the_whole_batch():
    # Training on half the batch gives other weights: the DDP comparison below can fail.
    whole = single_process_reference(steps=3, global_batch=16)
    again = single_process_reference(steps=3, global_batch=16)
    half = single_process_reference(steps=3, global_batch=8)
    assert all(torch.equal(whole[name], again[name]) for name in whole)
    assert not all(torch.allclose(whole[name], half[name]) for name in whole)


def test_the_rank_that_failed_first_is_reported(tmp_path):
    # What spawn reports when it happens to notice rank 0's follow-on failure before rank 1's.
    noticed = mp.ProcessRaisedException("Connection closed by peer", 0, 100)
    for rank, at, trace in ((0, 20.5, "Connection closed by peer"), (1, 20.0, "the cause")):
        failure = {"rank": rank, "pid": 100 + rank, "time": at, "trace": trace}
        (tmp_path / f"rank-{rank}.error").write_text(json.dumps(failure))
    first = _first_failure(tmp_path, noticed)
    assert isinstance(first, mp.ProcessRaisedException)
    assert (first.error_index, first.error_pid) == (1, 101)
    assert "the cause" in str(first) and "first rank to fail" in str(first)

    (tmp_path / "rank-1.error").unlink()
    assert _first_failure(tmp_path, noticed) is noticed


@pytest.mark.slow
def test_spawned_ranks_match_one_process_on_the_whole_batch():
    result = run_demo(world_size=2, steps=3, global_batch=16)
    assert result["ok"] and result["ranks_identical"] and result["backend"] == "gloo"
    reference = single_process_reference(steps=3, global_batch=16)
    rank0, rank1 = result["weights"]
    for name, expected in reference.items():
        torch.testing.assert_close(rank0[name], expected, **tolerance(torch.float32))
        assert torch.equal(rank0[name], rank1[name]), name
    assert result["max_abs_diff"] <= 1e-6


def _environment() -> dict[str, str]:
    # The ranks import forge_course from this checkout whether or not the package is installed.
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _live_members(group: int) -> list[int]:
    """Processes of a process group that are still running (zombies are already dead)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        return [group]
    alive = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if int(fields[2]) == group and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _run(
    command: list[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run `command` in its own process group; return its result and any process left behind.

    ``env`` is added to the environment.
    """
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env={**_environment(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        # multiprocessing's resource tracker notices its parent is gone only after it exits:
        # give the group a moment to wind down before calling anything left behind.
        deadline = time.monotonic() + 10
        while (left_behind := _live_members(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), left_behind


@pytest.mark.slow
def test_ddp_scales_each_gradient_before_the_all_reduce_not_after():
    three = gradient_scaling(world_size=3)
    entries, equal = three["entries"], three["equal"]
    assert equal["times 1/W, then summed"] == entries  # DDP's order, bit for bit
    assert equal["summed, then divided by W"] < entries
    assert equal["divided by W, then summed"] < entries
    # Halving is exact, so with 2 ranks no order can be told from another.
    assert set(gradient_scaling(world_size=2)["equal"].values()) == {entries}


@pytest.mark.slow
def test_torchrun_runs_the_module_and_matches():
    done, left_behind = _run([*TORCHRUN, *DEMO], timeout=180)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["ranks_identical"] and summary["world_size"] == 2
    assert summary["max_abs_diff"] <= 1e-6
    assert left_behind == []


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [TORCHRUN, SPAWN], ids=["torchrun", "spawn"])
def test_a_failing_rank_ends_the_whole_run(launcher):
    # Rank 0 is left waiting in the first all-reduce for a rank that is gone; the launcher must
    # stop it well before the 60 s collective timeout, and leave no process behind.
    done, left_behind = _run([*launcher, *DEMO, "--fail-rank", "1"], timeout=120)
    assert done.returncode != 0
    assert "rank 1 fails on purpose" in done.stderr
    if launcher is SPAWN:
        assert "ProcessRaisedException" in done.stderr
    assert left_behind == []
