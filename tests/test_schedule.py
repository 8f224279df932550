"""Tests for forge_course.reference.schedule: a real DataLoader and optimizer agree with it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from forge_course.reference.arithmetic import training_arithmetic
from forge_course.reference.guard import ReferenceCalled, learner_code
from forge_course.reference.schedule import update_schedule


def _run_the_correct_loop(n: int, b: int, k: int, drop_last: bool) -> list[tuple[int, bool]]:
    """Train a tiny model one epoch with accumulation; record what torch actually did."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = []
    # A hook that torch calls after each real optimizer.step(), whatever the loop's bookkeeping.
    optimizer.register_step_post_hook(lambda *_: steps.append(True))
    data = TensorDataset(torch.randn(n, 1), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=b, shuffle=True, drop_last=drop_last)
    sizes, seen = [size for size, _ in update_schedule(n, b, k, drop_last)], []
    for i, (x, y) in enumerate(loader):
        group = sizes[i - i % k : i - i % k + k]
        (torch.nn.functional.mse_loss(model(x), y) * len(x) / sum(group)).backward()
        before = len(steps)
        if (i + 1) % k == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
        seen.append((len(x), len(steps) > before))
    # Nothing is left behind for the next epoch.
    assert all(p.grad is None for p in model.parameters())
    return seen


def test_docstring_example_and_facts_batch_assembly():
    assert update_schedule(100, 16, 4) == [(16, False)] * 3 + [(16, True)] + [(16, False)] * 2 + [
        (4, True)
    ]
    assert update_schedule(100, 16, 1, drop_last=True) == [(16, True)] * 6


def test_running_example_with_accumulation():
    schedule = update_schedule(10_000, 32, 4)
    assert len(schedule) == 313
    assert schedule[-1] == (16, True)
    assert sum(step for _, step in schedule) == 79
    # 78 full groups of 4, then a tail group of one micro-batch.
    assert [i for i, (_, step) in enumerate(schedule) if step][-2:] == [311, 312]


def test_drop_last_with_fewer_examples_than_a_batch_is_empty():
    assert update_schedule(5, 8, 2, drop_last=True) == []
    assert update_schedule(5, 8, 2) == [(5, True)]


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 200),
    b=st.integers(1, 40),
    k=st.integers(1, 9),
    drop_last=st.booleans(),
)
def test_agrees_with_a_real_dataloader_and_optimizer(n, b, k, drop_last):
    assert update_schedule(n, b, k, drop_last) == _run_the_correct_loop(n, b, k, drop_last)


def _accumulated_gradients(n: int, b: int, k: int, weight) -> list[torch.Tensor]:
    """The gradient each update of one epoch applies, with ``weight(len(x), group)`` per loss."""
    gen = torch.Generator().manual_seed(0)
    x_all, y_all = torch.randn(n, 3, generator=gen), torch.randn(n, 1, generator=gen)
    model = torch.nn.Linear(3, 1, bias=False).double()
    with torch.no_grad():  # the same weights in every run; nothing steps, so they stay
        model.weight.copy_(torch.randn(1, 3, generator=gen))
    sizes, applied = [size for size, _ in update_schedule(n, b, k)], []
    for i, (x, y) in enumerate(DataLoader(TensorDataset(x_all, y_all), batch_size=b)):
        group = sizes[i - i % k : i - i % k + k]
        loss = torch.nn.functional.mse_loss(model(x.double()), y.double())
        (loss * weight(len(x), group)).backward()
        if (i + 1) % k == 0 or i + 1 == len(sizes):
            applied.append(model.weight.grad.clone())
            model.zero_grad()
    return applied


def _big_batch_gradients(n: int, b: int, k: int) -> list[torch.Tensor]:
    """The same updates made from one big batch each: what accumulation must reproduce."""
    return _accumulated_gradients(n, b * k, 1, lambda size, group: 1.0)


def test_weighting_by_share_of_examples_reproduces_the_big_batch_and_dividing_by_k_does_not():
    n, b, k = 10, 3, 2  # micro-batches of 3, 3 | 3, 1: the second update has a short one
    expected = _big_batch_gradients(n, b, k)
    by_share = _accumulated_gradients(n, b, k, lambda size, group: size / sum(group))
    by_k = _accumulated_gradients(n, b, k, lambda size, group: 1 / k)
    for got, want in zip(by_share, expected, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(by_k[0], expected[0])  # a full group: 1/K is the share
    assert not torch.allclose(by_k[1], expected[1])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 20_000),
    b=st.integers(1, 600),
    k=st.integers(1, 16),
    drop_last=st.booleans(),
)
def test_agrees_with_the_counts_of_training_arithmetic(n, b, k, drop_last):
    schedule = update_schedule(n, b, k, drop_last)
    counts = training_arithmetic(n, b, 1, k, drop_last)
    assert len(schedule) == counts["iters_per_epoch"]
    assert sum(size for size, _ in schedule) == counts["examples_seen"]
    assert sum(step for _, step in schedule) == counts["updates_per_epoch"]
    if schedule:
        assert schedule[-1] == (counts["last_batch_size"], True)


@pytest.mark.parametrize("name", ["dataset_size", "batch_size", "accum_steps"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3", None])
def test_invalid_counts_raise_a_value_error_naming_the_argument(name, bad):
    args = {"dataset_size": 100, "batch_size": 16, "accum_steps": 2}
    args[name] = bad
    with pytest.raises(ValueError, match=name):
        update_schedule(**args)


def test_drop_last_must_be_a_bool():
    with pytest.raises(ValueError, match="drop_last"):
        update_schedule(100, 16, 2, drop_last=1)


def test_learner_code_may_not_call_the_reference():
    with learner_code(), pytest.raises(ReferenceCalled):
        update_schedule(100, 16, 4)
