"""Tests for forge_course.reference.checkpoint: exact resume, safe loading, crash-proof saving."""

from __future__ import annotations

import os
import random
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from forge_course.reference.checkpoint import (
    CorruptCheckpoint,
    ResumableSampler,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from forge_course.reference.guard import ReferenceCalled, learner_code
from tests.helpers import resumable_run

REPO = Path(__file__).resolve().parents[1]
HELPER = REPO / "tests" / "helpers" / "resumable_run.py"


# --------------------------------------------------------------------------------------------
# ResumableSampler


def test_sampler_order_is_a_seeded_permutation_per_epoch():
    sampler = ResumableSampler(20, seed=7)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected = torch.randperm(20, generator=torch.Generator().manual_seed(7 + epoch))
        assert list(sampler) == expected.tolist()
    sampler.set_epoch(0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def test_sampler_resumes_at_the_next_index():
    sampler = ResumableSampler(30, seed=3)
    sampler.set_epoch(2)
    full = sampler.order()
    iterator = iter(sampler)
    handed_out = [next(iterator) for _ in range(11)]
    state = sampler.state_dict()
    assert state == {"epoch": 2, "position": 11, "seed": 3}

    resumed = ResumableSampler(30, seed=999)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the loop calls this at the top of the epoch it resumes in
    assert len(resumed) == 19
    assert handed_out + list(resumed) == full
    # The offset applies once: the same epoch again starts from its beginning.
    assert list(resumed) == full


def test_sampler_starts_a_new_epoch_from_its_beginning():
    sampler = ResumableSampler(12, seed=0)
    sampler.load_state_dict({"epoch": 1, "position": 12, "seed": 0})
    sampler.set_epoch(1)
    assert list(sampler) == []  # epoch 1 was finished when the state was saved
    sampler.set_epoch(2)
    assert sampler.state_dict()["position"] == 0
    assert list(sampler) == sampler.order()


def test_sampler_position_counts_consumed_examples_without_workers():
    sampler = ResumableSampler(50, seed=1)
    loader = DataLoader(TensorDataset(torch.arange(50)), batch_size=8, sampler=sampler)
    seen = []
    for batches, (batch,) in enumerate(loader, start=1):
        seen += batch.tolist()
        assert sampler.state_dict()["position"] == len(seen) == min(8 * batches, 50)
    assert seen == sampler.order()


def test_sampler_rejects_a_state_from_a_bigger_dataset():
    with pytest.raises(ValueError, match="another dataset"):
        ResumableSampler(10).load_state_dict({"epoch": 0, "position": 11, "seed": 0})


def test_iterating_a_dataloader_draws_from_the_global_generator_unless_it_has_its_own():
    dataset = TensorDataset(torch.arange(8))
    for generator, draws_globally in ((None, True), (torch.Generator(), False)):
        loader = DataLoader(dataset, batch_size=4, sampler=ResumableSampler(8), generator=generator)
        before = torch.get_rng_state()
        iter(loader)
        assert torch.equal(before, torch.get_rng_state()) != draws_globally


@pytest.mark.slow
def test_sampler_with_workers_needs_the_consumed_count():
    sampler = ResumableSampler(64, seed=5)
    loader = DataLoader(
        TensorDataset(torch.arange(64)), batch_size=4, sampler=sampler, num_workers=2
    )
    iterator = iter(loader)
    seen = [next(iterator)[0] for _ in range(3)]
    consumed = sum(len(batch) for batch in seen)
    # The workers have already been handed indices of batches the loop has not seen yet.
    assert sampler.state_dict()["position"] > consumed
    state = sampler.state_dict(consumed=consumed)
    del iterator  # stops its worker processes

    resumed = ResumableSampler(64)
    resumed.load_state_dict(state)
    rest = [
        int(i)
        for (batch,) in DataLoader(TensorDataset(torch.arange(64)), 4, sampler=resumed)
        for i in batch
    ]
    assert torch.cat(seen).tolist() + rest == sampler.order()


# --------------------------------------------------------------------------------------------
# save_checkpoint / load_checkpoint


def _setup(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    sampler = ResumableSampler(40, seed=seed)
    return model, optimizer, scheduler, scaler, sampler


def _train_a_little(model, optimizer, scheduler, scaler, sampler, steps):
    iterator = iter(sampler)
    for _ in range(steps):
        indices = torch.tensor([next(iterator) for _ in range(4)], dtype=torch.float32)
        x = indices[:, None].expand(4, 4) / 40
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()


def _draws():
    return (
        [random.random() for _ in range(3)],
        np.random.normal(size=3).tolist(),
        torch.rand(3),
        float(np.random.standard_normal()),  # exercises NumPy's cached second Gaussian
    )


def test_round_trip_restores_every_state_and_generator(tmp_path):
    objects = _setup(seed=0)
    _train_a_little(*objects, steps=3)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's state
    path = save_checkpoint(
        checkpoint_path(tmp_path, 3), *objects, epoch=0, step=3, best=0.25, tag="a"
    )
    assert path == tmp_path / "step-00000003.pt"
    after_save = _draws()
    model, optimizer, scheduler, scaler, sampler = objects

    fresh = _setup(seed=1)  # different weights and a different sampler seed
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    counters = load_checkpoint(path, *fresh)
    after_load = _draws()

    assert counters == {"epoch": 0, "step": 3, "best": 0.25, "tag": "a"}
    assert after_load[:2] == after_save[:2] and after_load[3] == after_save[3]
    assert torch.equal(after_load[2], after_save[2])
    new_model, new_optimizer, new_scheduler, new_scaler, new_sampler = fresh
    for a, b in zip(model.state_dict().values(), new_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), new_model.parameters(), strict=True):
        assert torch.equal(
            optimizer.state[p]["momentum_buffer"], new_optimizer.state[q]["momentum_buffer"]
        )
    assert new_scheduler.state_dict() == scheduler.state_dict()
    assert new_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    assert new_scaler.state_dict() == scaler.state_dict()
    assert (
        new_sampler.state_dict()
        == sampler.state_dict()
        == {
            "epoch": 0,
            "position": 12,
            "seed": 0,
        }
    )


def test_checkpoint_loads_with_weights_only(tmp_path):
    objects = _setup(seed=0)
    path = save_checkpoint(tmp_path / "c.pt", *objects, step=0)
    payload = torch.load(path, weights_only=True)
    assert {"model", "optimizer", "scheduler", "scaler", "sampler", "rng", "counters"} <= set(
        payload
    )
    assert set(payload["rng"]) == {"python", "numpy", "torch", "cuda"}
    counters = load_checkpoint(path, *_setup(seed=1), map_location="cpu")
    assert counters == {"step": 0}


def test_counters_must_be_plain_values(tmp_path):
    model, optimizer, *_ = _setup(seed=0)
    with pytest.raises(TypeError, match=r"best_loss=.*\.item\(\)"):
        save_checkpoint(tmp_path / "c.pt", model, optimizer, best_loss=torch.tensor(0.5))
    assert list(tmp_path.iterdir()) == []


def test_load_warns_about_state_it_was_not_given(tmp_path):
    model, optimizer, scheduler, *_ = _setup(seed=0)
    path = save_checkpoint(tmp_path / "c.pt", model, optimizer, scheduler)
    with pytest.warns(UserWarning, match="scheduler state but no scheduler"):
        load_checkpoint(path, model, optimizer)
    with pytest.raises(ValueError, match="saved without one"):
        load_checkpoint(path, model, optimizer, scheduler, sampler=ResumableSampler(4))


def _saved(folder: Path, step: int) -> Path:
    return save_checkpoint(checkpoint_path(folder, step), *_setup(seed=step), step=step)


def _flip_a_weight_byte(data: bytes) -> bytes:
    # The bytes of the first weight of the model that `_saved(folder, 8)` writes: the zip reader
    # does not notice a change there, only the checkpoint's own digest does.
    weight = _setup(seed=8)[0].state_dict()["0.weight"].numpy().tobytes()
    at = data.index(weight) + 5
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: b"", id="empty"),
        pytest.param(lambda data: bytes(range(256)) * 4, id="garbage"),
        pytest.param(_flip_a_weight_byte, id="one-weight-byte"),
    ],
)
def test_damaged_file_raises_a_clear_error(tmp_path, damage):
    path = _saved(tmp_path, 8)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptCheckpoint, match="corrupt") as caught:
        load_checkpoint(path, *_setup(seed=0))
    assert str(path) in str(caught.value)


def test_missing_file_is_not_called_corrupt(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.pt", *_setup(seed=0))


def test_latest_checkpoint_skips_a_truncated_newest_file(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for step in (4, 8, 12):
        _saved(tmp_path, step)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 12)

    newest = checkpoint_path(tmp_path, 12)
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.warns(UserWarning, match=r"step-00000012\.pt.*corrupt or truncated"):
        assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 8)


def test_overwriting_keeps_the_previous_file_as_a_fallback(tmp_path):
    path = checkpoint_path(tmp_path, 5)
    model, optimizer, *_ = _setup(seed=0)
    save_checkpoint(path, model, optimizer, version=1)
    save_checkpoint(path, model, optimizer, version=2)
    assert load_checkpoint(path, model, optimizer) == {"version": 2}
    previous = path.with_name(path.name + ".prev")
    assert load_checkpoint(previous, model, optimizer) == {"version": 1}

    path.write_bytes(b"")
    with pytest.warns(UserWarning, match="step-00000005.pt"):
        assert latest_checkpoint(tmp_path) == previous


def test_an_interrupted_save_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    model, optimizer, *_ = _setup(seed=0)
    first = save_checkpoint(checkpoint_path(tmp_path, 4), model, optimizer, step=4)
    overwritten = save_checkpoint(checkpoint_path(tmp_path, 8), model, optimizer, step=8)
    real_save = torch.save

    def save_half_then_fail(obj, file):
        real_save(obj, file)
        file.seek(file.tell() // 2)
        file.truncate()
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    for target in (checkpoint_path(tmp_path, 8), checkpoint_path(tmp_path, 12)):
        with pytest.raises(OSError, match="simulated"):
            save_checkpoint(target, model, optimizer, step=99)
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, overwritten.name]
    assert load_checkpoint(overwritten, model, optimizer) == {"step": 8}
    assert latest_checkpoint(tmp_path) == overwritten


@pytest.mark.skipif(not hasattr(os, "O_DIRECTORY"), reason="folders cannot be synced here")
def test_a_save_syncs_the_file_before_the_rename_and_the_folder_after_it(tmp_path, monkeypatch):
    path = checkpoint_path(tmp_path, 3)
    model, optimizer, *_ = _setup(seed=0)
    events, real_fsync, real_replace = [], os.fsync, os.replace

    def recording_fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def recording_replace(src, dst):
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    save_checkpoint(path, model, optimizer, step=3)
    assert events == ["fsync file", "replace", "fsync folder"]


def test_references_refuse_to_run_inside_learner_code(tmp_path):
    model, optimizer, *_ = _setup(seed=0)
    with learner_code():
        with pytest.raises(ReferenceCalled):
            save_checkpoint(tmp_path / "c.pt", model, optimizer)
        with pytest.raises(ReferenceCalled):
            ResumableSampler(3)


# --------------------------------------------------------------------------------------------
# Resuming a real run


def _run_in_process(folder: Path, resume: bool = False):
    losses = {}
    model = resumable_run.train(folder, losses.__setitem__, resume=resume)
    return losses, model.state_dict()


# Resuming from the checkpoint on epoch 0's last step calls scheduler.step() before this process
# has called optimizer.step(); torch's check for that order cannot know the optimizer was restored.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")
def test_resuming_from_any_checkpoint_reproduces_the_run(tmp_path):
    full_losses, full_weights = _run_in_process(tmp_path / "full")
    checkpoints = sorted((tmp_path / "full").glob("step-*.pt"))
    assert len(checkpoints) == 48 // resumable_run.EVERY
    for checkpoint in checkpoints:
        folder = tmp_path / checkpoint.stem
        folder.mkdir()
        shutil.copy(checkpoint, folder)
        losses, weights = _run_in_process(folder, resume=True)
        saved_step = int(checkpoint.stem.split("-")[1])
        assert losses == {s: v for s, v in full_losses.items() if s > saved_step}, checkpoint
        for name, value in full_weights.items():
            assert torch.equal(weights[name], value), (checkpoint.name, name)


def _read_losses(path: Path) -> dict[int, str]:
    pairs = (line.split() for line in path.read_text().splitlines())
    return {int(step): loss for step, loss in pairs}


def _start(folder: Path, *args: str) -> subprocess.Popen:
    # The child imports forge_course from this checkout whether or not the package is installed.
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.Popen(
        [sys.executable, str(HELPER), str(folder), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(process: subprocess.Popen, timeout: float = 120) -> int:
    try:
        _, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode in (0, -signal.SIGKILL), stderr
    return process.returncode


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_run_killed_mid_epoch_resumes_bit_for_bit(tmp_path):
    steps = resumable_run.EPOCHS * resumable_run.DATA_SIZE // resumable_run.BATCH
    per_epoch = resumable_run.DATA_SIZE // resumable_run.BATCH
    # Seeded, so the test is repeatable; never on an epoch's last step, so the kill is mid-epoch.
    kill_at = random.Random(2024).choice([s for s in range(14, steps) if s % per_epoch])
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    reference.mkdir()
    interrupted.mkdir()

    runs = [_start(reference), _start(interrupted, "--tag", "killed", "--kill-at", str(kill_at))]
    assert [_finish(run) for run in runs] == [0, -signal.SIGKILL]
    killed_losses = _read_losses(interrupted / "losses-killed.txt")
    assert max(killed_losses) == kill_at and not (interrupted / "final.pt").exists()

    assert _finish(_start(interrupted, "--tag", "resumed", "--resume")) == 0

    expected = _read_losses(reference / "losses-run.txt")
    resumed_losses = _read_losses(interrupted / "losses-resumed.txt")
    last_saved = (kill_at - 1) // resumable_run.EVERY * resumable_run.EVERY
    assert min(resumed_losses) == last_saved + 1
    assert all(expected[step] == loss for step, loss in killed_losses.items())
    assert {**killed_losses, **resumed_losses} == expected
    final = torch.load(interrupted / "final.pt", weights_only=True)
    for name, value in torch.load(reference / "final.pt", weights_only=True).items():
        assert torch.equal(final[name], value), name
