"""Tests for forge_course.reference.arithmetic: the FACTS table, and a real DataLoader's counts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from forge_course.reference.arithmetic import training_arithmetic
from forge_course.reference.guard import ReferenceCalled, learner_code


def test_facts_main_example():
    got = training_arithmetic(10_000, 32, 3)
    assert got == {
        "iters_per_epoch": 313,
        "last_batch_size": 16,
        "micro_steps": 939,
        "updates_per_epoch": 313,
        "total_updates": 939,
        "effective_batch_size": 32,
        "examples_seen": 30_000,
    }


def test_facts_main_example_with_accumulation():
    got = training_arithmetic(10_000, 32, 3, accum_steps=4)
    assert got["effective_batch_size"] == 128
    assert got["updates_per_epoch"] == 79
    assert got["total_updates"] == 237
    # Accumulation changes the updates, not the forward/backward passes.
    assert got["micro_steps"] == 939


def test_facts_small_hand_case():
    got = training_arithmetic(1_000, 64, 5)
    assert got["iters_per_epoch"] == 16
    assert got["last_batch_size"] == 40
    assert 15 * 64 + 40 == 1_000
    assert got["micro_steps"] == 80
    assert got["examples_seen"] == 5_000


def test_facts_quizzes():
    assert training_arithmetic(50_000, 256, 1)["iters_per_epoch"] == 196
    got = training_arithmetic(20_000, 64, 10, accum_steps=4)
    assert got["iters_per_epoch"] == 313
    assert got["updates_per_epoch"] == 79
    assert got["total_updates"] == 790


def test_facts_batch_assembly_with_and_without_drop_last():
    kept = training_arithmetic(100, 16, 1)
    assert (kept["iters_per_epoch"], kept["last_batch_size"]) == (7, 4)
    dropped = training_arithmetic(100, 16, 1, drop_last=True)
    assert (dropped["iters_per_epoch"], dropped["last_batch_size"]) == (6, 16)
    assert 100 - dropped["examples_seen"] == 4


def test_drop_last_with_fewer_examples_than_a_batch_gives_no_iterations():
    got = training_arithmetic(5, 8, 3, accum_steps=2, drop_last=True)
    assert got["iters_per_epoch"] == 0
    assert got["last_batch_size"] == 0
    assert got["micro_steps"] == got["total_updates"] == got["examples_seen"] == 0


def test_exact_for_counts_too_large_for_float_division():
    n = 2**60 + 1
    assert training_arithmetic(n, 2, 1)["iters_per_epoch"] == 2**59 + 1


@pytest.mark.parametrize("name", ["dataset_size", "batch_size", "epochs", "accum_steps"])
@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "4", None])
def test_invalid_counts_raise_a_value_error_naming_the_argument(name, bad):
    args = {"dataset_size": 100, "batch_size": 16, "epochs": 2, "accum_steps": 2}
    args[name] = bad
    with pytest.raises(ValueError, match=name):
        training_arithmetic(**args)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_drop_last_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="drop_last"):
        training_arithmetic(100, 16, 1, drop_last=bad)


def test_learner_code_may_not_call_the_reference():
    with learner_code(), pytest.raises(ReferenceCalled):
        training_arithmetic(100, 16, 1)


def _run_the_loop(n: int, b: int, epochs: int, k: int, drop_last: bool) -> dict[str, int]:
    """Count what the correct accumulation loop does over a real DataLoader."""
    loader = DataLoader(torch.arange(n), batch_size=b, drop_last=drop_last)
    micro = updates = seen = 0
    sizes: list[int] = []
    for _ in range(epochs):
        sizes = []
        for i, batch in enumerate(loader):
            micro += 1
            seen += len(batch)
            sizes.append(len(batch))
            # Step after every K-th micro-batch, and on the tail of the epoch.
            if (i + 1) % k == 0 or i + 1 == len(loader):
                updates += 1
    return {
        "iters_per_epoch": len(sizes),
        "last_batch_size": sizes[-1] if sizes else 0,
        "micro_steps": micro,
        "updates_per_epoch": updates // epochs,
        "total_updates": updates,
        "effective_batch_size": b * k,
        "examples_seen": seen,
    }


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 300),
    b=st.integers(1, 70),
    epochs=st.integers(1, 3),
    k=st.integers(1, 9),
    drop_last=st.booleans(),
)
def test_agrees_with_counting_a_real_dataloader(n, b, epochs, k, drop_last):
    assert training_arithmetic(n, b, epochs, k, drop_last) == _run_the_loop(
        n, b, epochs, k, drop_last
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(n=st.integers(1, 10**6), b=st.integers(1, 5_000), k=st.integers(1, 64))
def test_updates_per_epoch_is_ceil_of_n_over_effective_batch(n, b, k):
    # The identity ceil(ceil(N/B)/K) == ceil(N/(BK)) that makes the simple formula right.
    assert training_arithmetic(n, b, 1, k)["updates_per_epoch"] == -(-n // (b * k))
