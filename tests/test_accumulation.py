"""Tests for forge_course.reference.accumulation: equal to one big batch, and nothing leaks."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from forge_course.device import available_devices, tolerance
from forge_course.reference.accumulation import accumulate_step, train_epoch_accumulated
from forge_course.reference.guard import ReferenceCalled, learner_code

DEVICES = available_devices()
DTYPE = torch.float64
# derandomize: the same examples on every run; database=None: no .hypothesis folder left behind.
PROPERTY = settings(max_examples=20, deadline=None, derandomize=True, database=None)

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
}


def make_model(device: torch.device, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    return model.to(device=device, dtype=DTYPE)


def make_data(n: int, device: torch.device | str = "cpu", seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen, dtype=DTYPE)
    y = torch.randn(n, 2, generator=gen, dtype=DTYPE)
    return x.to(device), y.to(device)


def split(x: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> list[tuple[torch.Tensor, ...]]:
    return list(zip(torch.split(x, sizes), torch.split(y, sizes)))


def big_batch_step(model, optimizer, loss_fn, x, y, max_grad_norm=None) -> float:
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def assert_same_params(got: torch.nn.Module, expected: torch.nn.Module) -> None:
    for (name, p), q in zip(got.named_parameters(), expected.parameters()):
        torch.testing.assert_close(
            p, q, **tolerance(p.dtype, p.device), msg=lambda m, name=name: f"{name}: {m}"
        )


def grads_are_clear(model: torch.nn.Module) -> bool:
    return all(p.grad is None or not p.grad.any() for p in model.parameters())


# ---------------------------------------------------------------------------- accumulate_step


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@given(
    splits=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=5), min_size=1, max_size=3),
    max_grad_norm=st.sampled_from([None, 1e-2]),
)
@PROPERTY
def test_accumulate_step_equals_big_batch_steps(device, opt_name, splits, max_grad_norm):
    # Several updates in a row, so momentum and Adam's moments carry from one to the next.
    loss_fn = torch.nn.MSELoss()
    model = make_model(device)
    twin = copy.deepcopy(model)
    opt = OPTIMIZERS[opt_name](model.parameters())
    twin_opt = OPTIMIZERS[opt_name](twin.parameters())
    for p in model.parameters():
        p.grad = torch.full_like(p, 100.0)  # stale gradients that must not leak in
    for seed, sizes in enumerate(splits):
        x, y = make_data(sum(sizes), device, seed=seed)
        got = accumulate_step(model, opt, loss_fn, split(x, y, sizes), max_grad_norm)
        expected = big_batch_step(twin, twin_opt, loss_fn, x, y, max_grad_norm)
        assert got == pytest.approx(expected, rel=1e-9)
        assert grads_are_clear(model), "gradients leak out of accumulate_step"
    assert_same_params(model, twin)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_clipping_applies_to_the_accumulated_gradient(device):
    # A max norm far below the gradient's norm: clipping each micro-batch instead would differ.
    loss_fn = torch.nn.MSELoss()
    model, x, y = make_model(device), *make_data(9, device)
    twin, per_piece = copy.deepcopy(model), copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=1.0)
    accumulate_step(model, opt, loss_fn, split(x, y, [4, 5]), max_grad_norm=1e-3)
    big_batch_step(twin, twin_opt, loss_fn, x, y, max_grad_norm=1e-3)
    assert_same_params(model, twin)

    wrong_opt = torch.optim.SGD(per_piece.parameters(), lr=1.0)
    for xi, yi in split(x, y, [4, 5]):
        (loss_fn(per_piece(xi), yi) * len(xi) / 9).backward()
        torch.nn.utils.clip_grad_norm_(per_piece.parameters(), 1e-3)
    wrong_opt.step()
    assert not all(torch.allclose(p, q) for p, q in zip(per_piece.parameters(), twin.parameters()))


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_one_over_k_weighting_is_wrong_for_uneven_micro_batches(device):
    # The fact behind the n_i / N weights: with sizes [5, 1], 1 / K gives the lone example of the
    # short micro-batch half of the loss, where the big batch gives it a sixth.
    loss_fn = torch.nn.MSELoss()
    model, x, y = make_model(device), *make_data(6, device)
    for xi, yi in split(x, y, [5, 1]):
        (loss_fn(model(xi), yi) / 2).backward()
    one_over_k = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_fn(model(x), y).backward()
    assert not all(torch.allclose(g, p.grad) for g, p in zip(one_over_k, model.parameters()))


def test_accumulate_step_rejects_an_empty_list():
    model = make_model(torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="micro_batches"):
        accumulate_step(model, opt, torch.nn.MSELoss(), [])


# ------------------------------------------------------------------- train_epoch_accumulated

# (N, B, K): a tail group of 1, a tail group of 2, K dividing the micro-batches, no accumulation.
EPOCH_CASES = [(100, 16, 3), (100, 16, 5), (60, 10, 3), (10, 4, 1)]


def loader(n: int, batch_size: int) -> DataLoader:
    return DataLoader(TensorDataset(*make_data(n)), batch_size=batch_size, shuffle=False)


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize(("n", "b", "k"), EPOCH_CASES)
def test_epoch_update_count_and_no_leftover_gradients(device, n, b, k):
    model = make_model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    steps = []
    opt.register_step_post_hook(lambda *_: steps.append(1))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda update: 0.5**update)

    got = train_epoch_accumulated(model, opt, torch.nn.MSELoss(), loader(n, b), k, scheduler=sched)

    expected_updates = math.ceil(math.ceil(n / b) / k)
    assert got["updates"] == len(steps) == expected_updates
    assert got["samples"] == n
    # The scheduler counted optimizer updates, not micro-batches.
    assert sched.last_epoch == expected_updates
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**expected_updates)
    assert grads_are_clear(model), "the last group's gradients were left in .grad"


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize(("n", "b", "k"), EPOCH_CASES)
def test_epoch_equals_plain_epoch_with_batch_b_times_k(device, n, b, k):
    # Without shuffling, K consecutive micro-batches of B are one batch of B·K, tail included.
    loss_fn = torch.nn.MSELoss()
    model = make_model(device)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)

    train_epoch_accumulated(model, opt, loss_fn, loader(n, b), k, max_grad_norm=0.5)
    for x, y in loader(n, b * k):
        big_batch_step(twin, twin_opt, loss_fn, x.to(device), y.to(device), max_grad_norm=0.5)
    assert_same_params(model, twin)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_epoch_mean_loss_is_weighted_by_examples(device):
    # With lr=0 the model never changes, so the epoch's mean is the loss on the whole data set;
    # a plain mean over micro-batches would over-weight the short last batch (100 = 6·16 + 4).
    loss_fn = torch.nn.MSELoss()
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    got = train_epoch_accumulated(model, opt, loss_fn, loader(100, 16), 3)
    x, y = make_data(100, device)
    with torch.no_grad():
        expected = loss_fn(model(x), y).item()
    assert got["mean_loss"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_naive_modulo_loop_leaks_the_tail(device):
    # The loop the module docstring warns about, with 7 micro-batches and K = 3.
    loss_fn, k = torch.nn.MSELoss(), 3
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    for i, (x, y) in enumerate(loader(100, 16)):
        (loss_fn(model(x.to(device)), y.to(device)) / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
    assert not grads_are_clear(model), "expected the naive loop to leave the tail in .grad"

    fixed = make_model(device)
    fixed_opt = torch.optim.SGD(fixed.parameters(), lr=0.1)
    train_epoch_accumulated(fixed, fixed_opt, loss_fn, loader(100, 16), k)
    assert grads_are_clear(fixed)


def test_epoch_rejects_bad_accum_steps_and_empty_loaders():
    model = make_model(torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="accum_steps"):
            train_epoch_accumulated(model, opt, torch.nn.MSELoss(), loader(10, 4), bad)
    with pytest.raises(ValueError, match="loader"):
        train_epoch_accumulated(model, opt, torch.nn.MSELoss(), [], 2)


def test_references_refuse_to_run_inside_learner_code():
    model = make_model(torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with learner_code(), pytest.raises(ReferenceCalled):
        accumulate_step(model, opt, torch.nn.MSELoss(), [make_data(2)])
    with learner_code(), pytest.raises(ReferenceCalled):
        train_epoch_accumulated(model, opt, torch.nn.MSELoss(), loader(4, 2), 1)
