"""Tests for forge_course.reference.amp: an AMP step matches float32, and the scaler skips."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from forge_course.device import available_devices, tolerance
from forge_course.reference.amp import (
    amp_train_step,
    autocast_dtype,
    make_scaler,
    step_was_skipped,
)
from forge_course.reference.guard import ReferenceCalled, learner_code

DEVICES = available_devices()
LR = 0.1


def make_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model.to(device)


def make_batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
    return x.to(device), y.to(device)


def float32_step(model, x, y, max_grad_norm=None) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def applied_gradients(before: torch.nn.Module, after: torch.nn.Module) -> list[torch.Tensor]:
    # What SGD subtracted, divided by the learning rate: the gradient the update really used.
    # Comparing these, not the weights, keeps a small update from hiding a wrong gradient.
    return [(p0 - p1) / LR for p0, p1 in zip(before.parameters(), after.parameters())]


def assert_same_update(start, got, expected, dtype, device) -> None:
    for g, e in zip(applied_gradients(start, got), applied_gradients(start, expected)):
        torch.testing.assert_close(g, e, **tolerance(dtype, device))


# ---------------------------------------------------------------------------- the dtype choice


@pytest.mark.parametrize(
    ("device", "dtype"),
    [
        ("cpu", torch.bfloat16),
        (torch.device("cpu"), torch.bfloat16),
        ("cuda", torch.float16),
        ("cuda:1", torch.float16),
        ("mps", torch.float16),
    ],
)
def test_autocast_dtype_per_device_type(device, dtype):
    assert autocast_dtype(device) is dtype


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_scaler_only_where_autocast_uses_float16(device):
    scaler = make_scaler(device)
    if autocast_dtype(device) is torch.float16:
        assert isinstance(scaler, torch.amp.GradScaler)
        assert scaler.is_enabled()
    else:
        assert scaler is None, "bfloat16 needs no GradScaler"


def test_on_the_cpu_softmax_and_sums_keep_bfloat16_and_losses_come_out_float32():
    # The module docstring's per-device lists: CUDA runs softmax and sums in float32, the CPU
    # does not, so after a bfloat16 matmul they stay bfloat16 there.
    a, target = torch.randn(8, 8), torch.zeros(8, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = a @ a
        assert low.dtype is torch.bfloat16
        assert torch.softmax(low, -1).dtype is torch.bfloat16
        assert torch.log_softmax(low, -1).dtype is torch.bfloat16
        assert low.sum().dtype is torch.bfloat16
        assert torch.nn.functional.cross_entropy(low, target).dtype is torch.float32
        assert torch.nn.functional.mse_loss(low, a).dtype is torch.float32


# --------------------------------------------------------------------------- amp_train_step


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_forward_runs_in_16_bits_and_weights_stay_float32(device):
    model, (x, y) = make_model(device), make_batch(device)
    seen = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    amp_train_step(model, torch.optim.SGD(model.parameters(), lr=LR), torch.nn.MSELoss(), x, y)
    assert seen == [autocast_dtype(device)]
    assert all(p.dtype is torch.float32 for p in model.parameters())


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_the_dtype_argument_chooses_autocasts_type(device, dtype):
    model, (x, y) = make_model(device), make_batch(device)
    seen = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    amp_train_step(model, optimizer, torch.nn.MSELoss(), x, y, dtype=dtype)
    assert seen == [dtype]


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_amp_step_matches_a_float32_step(device):
    start, (x, y) = make_model(device), make_batch(device)
    model, twin = copy.deepcopy(start), copy.deepcopy(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = make_scaler(device)
    loss = amp_train_step(model, optimizer, torch.nn.MSELoss(), x, y, scaler)
    expected_loss = float32_step(twin, x, y)

    dtype = autocast_dtype(device)
    assert loss == pytest.approx(expected_loss, rel=tolerance(dtype, device)["rtol"])
    assert_same_update(start, model, twin, dtype, device)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_scaler_path_with_clipping_matches_a_float32_step(device):
    # Clipping must see unscaled gradients: clipped scaled ones would shrink the update 65536×.
    start, (x, y) = make_model(device), make_batch(device)
    model, twin = copy.deepcopy(start), copy.deepcopy(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler(device.type)
    before = scaler.get_scale()
    amp_train_step(model, optimizer, torch.nn.MSELoss(), x, y, scaler, max_grad_norm=0.05)
    float32_step(twin, x, y, max_grad_norm=0.05)

    assert not step_was_skipped(scaler, before)
    assert scaler.get_scale() == before == 2.0**16
    assert_same_update(start, model, twin, autocast_dtype(device), device)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_overflow_skips_the_update_and_halves_the_scale(device):
    model, (x, y) = make_model(device), make_batch(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    scaler = torch.amp.GradScaler(device.type)
    # Simulate an overflow: one parameter's gradient comes back as inf.
    hook = model[0].weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    weights = [p.detach().clone() for p in model.parameters()]
    before = scaler.get_scale()

    loss = amp_train_step(model, optimizer, loss_fn, x, y, scaler)

    assert step_was_skipped(scaler, before)
    assert scaler.get_scale() == before / 2
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
    assert optimizer.state_dict()["state"] == {}, "a skipped step must not touch momentum"
    assert math.isfinite(loss), "the loss itself was fine; the gradient was not"

    # With the overflow gone the next step goes through at the lowered scale.
    hook.remove()
    before = scaler.get_scale()
    amp_train_step(model, optimizer, loss_fn, x, y, scaler)
    assert not step_was_skipped(scaler, before)
    assert not all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))


def test_no_scaler_never_reports_a_skip():
    assert step_was_skipped(None, 65536.0) is False


# ------------------------------------------------------------------------- the underflow fact


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_small_gradient_underflows_in_float16_unless_scaled(device):
    grad = torch.tensor(1e-8, device=device)
    assert grad.to(torch.float16).item() == 0.0
    scaled = (grad * 2.0**16).to(torch.float16)
    assert scaled.item() != 0.0
    # Unscaled in float32 it comes back to within float16's relative precision (2**-11).
    assert (scaled.float() / 2.0**16).item() == pytest.approx(1e-8, rel=2.0**-11)
    # bfloat16 has float32's exponent range: no scaling needed.
    assert grad.to(torch.bfloat16).item() == pytest.approx(1e-8, rel=2.0**-8)


def test_references_refuse_to_run_inside_learner_code():
    model, (x, y) = make_model(torch.device("cpu")), make_batch(torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for call in (
        lambda: autocast_dtype("cpu"),
        lambda: make_scaler("cpu"),
        lambda: amp_train_step(model, optimizer, torch.nn.MSELoss(), x, y),
    ):
        with learner_code(), pytest.raises(ReferenceCalled):
            call()
