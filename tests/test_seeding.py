"""Tests for forge_course.reference.seeding: repeatable draws, deterministic mode, EarlyStopping."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from forge_course.device import available_devices
from forge_course.reference.guard import ReferenceCalled, learner_code
from forge_course.reference.seeding import EarlyStopping, seed_everything

DEVICES = available_devices()


@pytest.fixture(autouse=True)
def restore_global_state(monkeypatch):
    """Put back every generator, flag and variable seed_everything touches."""
    # delenv records the current value (or its absence) and restores it after the test.
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    py, np_state, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    random.setstate(py)
    np.random.set_state(np_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2:]


# ------------------------------------------------------------------------------ seed_everything


def draw(device: torch.device) -> tuple:
    order = [int(i) for batch in DataLoader(range(10), batch_size=4, shuffle=True) for i in batch]
    dropped = torch.nn.functional.dropout(torch.ones(32, device=device), p=0.5)
    return (
        [random.random() for _ in range(3)],
        np.random.rand(3).tolist(),
        torch.rand(3, device=device).tolist(),
        order,
        dropped.tolist(),
    )


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_same_seed_same_numbers_from_every_generator(device):
    seed_everything(123)
    first = draw(device)
    seed_everything(123)
    second = draw(device)
    seed_everything(124)
    other = draw(device)
    assert first == second
    # Each generator on its own must change with the seed, or it was never seeded.
    assert all(a != b for a, b in zip(first, other))


def test_seed_is_validated():
    for bad in (-1, 2**32):
        with pytest.raises(ValueError, match="seed"):
            seed_everything(bad)
    with pytest.raises(TypeError):
        seed_everything(1.5)
    seed_everything(np.int64(7))  # NumPy integers are whole numbers too
    assert torch.initial_seed() == 7


def test_deterministic_mode_is_switched_on_and_back_off():
    torch.backends.cudnn.benchmark = True
    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    # A visible effect on any device: memory from torch.empty is filled with nan, not garbage.
    assert torch.empty(16).isnan().all()

    seed_everything(0)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_a_workspace_setting_of_ones_own_survives(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    seed_everything(0)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.slow
def test_hash_seed_reaches_child_processes():
    def child_hash() -> str:
        code = "print(hash('forge'))"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
        return done.stdout.decode().strip()

    seed_everything(5)
    first, second = child_hash(), child_hash()
    seed_everything(6)
    assert first == second != child_hash()


# -------------------------------------------------------------------------------- EarlyStopping


def run(stopper: EarlyStopping, values: list[float]) -> list[bool]:
    return [stopper.step(v) for v in values]


def test_patience_two_with_min_delta():
    values = [1.0, 0.95, 0.85, 0.8, 0.79]
    stopper = EarlyStopping(patience=2, min_delta=0.1)
    # 0.95 is not 0.1 below 1.0 (bad 1); 0.85 is (best); 0.8 and 0.79 are not (bad 1, bad 2).
    assert run(stopper, values) == [False, False, False, False, True]
    assert (stopper.best, stopper.best_epoch, stopper.num_bad_epochs) == (0.85, 2, 2)
    # Without min_delta every value is an improvement.
    plain = EarlyStopping(patience=2)
    assert not any(run(plain, values))
    assert (plain.best, plain.best_epoch) == (0.79, 4)


def test_mode_max_and_ties_are_not_improvements():
    stopper = EarlyStopping(patience=2, mode="max")
    assert run(stopper, [0.5, 0.6, 0.6, 0.55]) == [False, False, False, True]
    assert (stopper.best, stopper.best_epoch) == (0.6, 1)


def test_an_improvement_resets_the_count_and_nan_is_never_one():
    stopper = EarlyStopping(patience=3)
    assert run(stopper, [2.0, 3.0, 3.0, 1.0, math.nan, math.nan]) == [False] * 6
    assert stopper.step(torch.tensor(1.5)) is True
    assert (stopper.best, stopper.best_epoch, stopper.epochs) == (1.0, 3, 7)


def test_before_any_step():
    assert EarlyStopping(1).state_dict() == {
        "best": math.inf,
        "best_epoch": None,
        "num_bad_epochs": 0,
        "epochs": 0,
    }
    assert EarlyStopping(1, mode="max").best == -math.inf


def test_state_round_trip_through_a_safe_checkpoint(tmp_path):
    values = [1.0, 0.7, 0.8, 0.75, 0.9, 0.6, 0.65, 0.66]
    whole = EarlyStopping(patience=3, min_delta=0.01)
    expected = run(whole, values)

    first = EarlyStopping(patience=3, min_delta=0.01)
    got = run(first, values[:3])
    torch.save({"early_stopping": first.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["early_stopping"]
    assert all(v is None or type(v) in (int, float) for v in state.values())

    resumed = EarlyStopping(patience=3, min_delta=0.01)
    resumed.load_state_dict(state)
    got += run(resumed, values[3:])
    assert got == expected
    assert resumed.state_dict() == whole.state_dict()


def test_load_state_dict_names_missing_entries():
    with pytest.raises(KeyError, match="num_bad_epochs"):
        EarlyStopping(2).load_state_dict({"best": 1.0, "best_epoch": 0, "epochs": 1})


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"patience": 0}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"patience": True}, "patience"),
        ({"patience": 2, "min_delta": -0.1}, "min_delta"),
        ({"patience": 2, "min_delta": math.nan}, "min_delta"),
        ({"patience": 2, "min_delta": "0.1"}, "min_delta"),
        ({"patience": 2, "mode": "minimum"}, "mode"),
    ],
)
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        EarlyStopping(**kwargs)


def test_references_refuse_to_run_inside_learner_code():
    with learner_code(), pytest.raises(ReferenceCalled):
        seed_everything(0)
    with learner_code(), pytest.raises(ReferenceCalled):
        EarlyStopping(2)
