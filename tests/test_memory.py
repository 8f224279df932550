"""Tests for forge_course.reference.memory: saved-for-backward bytes against hand counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from forge_course.device import available_devices
from forge_course.reference.memory import peak_rss_bytes, saved_activation_bytes

DEVICES = available_devices()
F32 = 4  # bytes per float32 element


def tiny_mlp(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)]
    return torch.nn.Sequential(*layers).to(device)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_tiny_mlp_matches_the_hand_count(device):
    # Batch of 5 through Linear(4→3), ReLU, Linear(3→2):
    # - Linear 1 saves its input x (5×4) for the weight's gradient. It does not save its weight:
    #   that is only needed for x's gradient, and x does not require grad.
    # - ReLU saves its output (5×3); Linear 2 saves the same tensor as its input: counted once.
    # - Linear 2 saves its (transposed) weight for the gradient flowing back to ReLU: a
    #   parameter, so not counted.
    x = torch.randn(5, 4, device=device)
    assert saved_activation_bytes(tiny_mlp(device), x) == (5 * 4 + 5 * 3) * F32


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_loss_adds_the_prediction_and_the_target(device):
    # mse_loss saves both of its inputs: the prediction (5×2) and the target (5×2).
    model, x, target = tiny_mlp(device), torch.randn(5, 4, device=device), torch.zeros(5, 2)

    def loss(x):
        return torch.nn.functional.mse_loss(model(x), target.to(device))

    assert saved_activation_bytes(loss, x) == (5 * 4 + 5 * 3 + 5 * 2 + 5 * 2) * F32


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_nothing_is_saved_without_grad(device):
    model, x = tiny_mlp(device), torch.randn(5, 4, device=device)
    with torch.no_grad():
        assert saved_activation_bytes(model, x) == 0
    with torch.inference_mode():
        assert saved_activation_bytes(model, x) == 0


def test_a_tensor_saved_twice_counts_once():
    # a * a saves `a` as both factors: one allocation of 10 float32 values.
    a = torch.randn(10, requires_grad=True)
    assert saved_activation_bytes(torch.mul, a, a) == 10 * F32


def test_a_saved_view_counts_its_whole_storage():
    # sin saves its input, here a 1-element view that keeps all 100 elements alive.
    big = torch.randn(100, requires_grad=True)
    assert saved_activation_bytes(lambda t: torch.sin(t[:1]), big) == 100 * F32


def test_two_views_of_one_storage_count_once():
    # Two halves saved by two different nodes are two tensors but one 100-element allocation.
    big = torch.randn(100, requires_grad=True)
    assert saved_activation_bytes(lambda t: torch.sin(t[:50]) + torch.sin(t[50:]), big) == 100 * F32


def test_parameters_and_their_views_are_not_counted():
    weight = torch.nn.Parameter(torch.randn(6, 6))
    assert saved_activation_bytes(torch.sin, weight) == 0
    assert saved_activation_bytes(lambda w: torch.sin(w[:, 1:].t()), weight) == 0
    # The same values in a plain tensor that requires grad are counted.
    plain = weight.detach().clone().requires_grad_()
    assert saved_activation_bytes(torch.sin, plain) == 36 * F32


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_checkpointing_a_block_saves_only_its_input(device):
    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU()
    ).to(device)
    x = torch.randn(16, 8, device=device)

    plain = saved_activation_bytes(block, x)
    # x (16×8) and each ReLU's output (16×32); the first is also Linear 2's input, counted once.
    assert plain == (16 * 8 + 16 * 32 + 16 * 32) * F32
    kept = saved_activation_bytes(lambda t: checkpoint(block, t, use_reentrant=False), x)
    # The checkpoint keeps the block's input and recomputes the rest during backward.
    assert kept == 16 * 8 * F32 < plain


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_peak_rss_agrees_with_the_kernel():
    # VmHWM in /proc/self/status is Linux's own record of the peak RSS, in kB. The two are not
    # read at the same instant and the kernel batches its RSS counters per thread, so allow a
    # few MiB; a unit mistake would be off by a factor of 1024.
    status = Path("/proc/self/status").read_text().splitlines()
    kernel = int(next(s for s in status if s.startswith("VmHWM")).split()[1]) * 1024
    assert peak_rss_bytes() == pytest.approx(kernel, abs=8 * 2**20)


def test_peak_rss_is_in_bytes():
    # A process that imported torch has held well over 50 MiB; in kilobytes it would read as
    # about 200 thousand, and kilobytes multiplied by 1024 twice would exceed a terabyte.
    assert 50 * 2**20 < peak_rss_bytes() < 2**40
