"""Tests for forge_course.reference.detectors, against torch's own machinery and hand counts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from forge_course.device import available_devices
from forge_course.reference.detectors import (
    ActivationWatch,
    grad_norm,
    graph_leaks,
    nonfinite_grads,
)

DEVICES = available_devices()
F32 = 4  # bytes per float32 element


def mlp(device, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    layers = [nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)]
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def backward(model, device, dtype=torch.float32, scale=1.0):
    x = torch.randn(5, 4, dtype=dtype, device=device)
    (scale * model(x).pow(2).mean()).backward()


def torch_norm(model):
    params = [p for p in model.parameters() if p.grad is not None]
    return float(nn.utils.clip_grad_norm_(params, math.inf))


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_grad_norm_equals_what_clip_grad_norm_returns(device, dtype):
    if device.type == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    model = mlp(device, dtype)
    backward(model, device, dtype, scale=100.0)
    mine = grad_norm(model)
    assert isinstance(mine, float)
    assert mine == pytest.approx(torch_norm(model), rel=1e-6)
    assert mine > 1.0  # large enough that clipping to 1 would have changed something


def test_grad_norm_is_the_norm_of_all_entries_as_one_vector():
    model = mlp("cpu", torch.float64)
    backward(model, "cpu", torch.float64)
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert grad_norm(model) == pytest.approx(flat.norm().item(), rel=1e-12)


def test_grad_norm_skips_parameters_without_a_gradient():
    model = mlp("cpu")
    model[0].requires_grad_(False)
    backward(model, "cpu")
    assert model[0].weight.grad is None
    expected = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model[2].parameters()))
    assert grad_norm(model) == pytest.approx(expected, rel=1e-6)


def test_grad_norm_is_zero_before_any_backward_and_changes_nothing():
    model = mlp("cpu")
    assert grad_norm(model) == 0.0
    backward(model, "cpu", scale=100.0)
    before = [p.grad.clone() for p in model.parameters()]
    grad_norm(model)
    for p, g in zip(model.parameters(), before):
        assert torch.equal(p.grad, g)


def test_grad_norm_without_zero_grad_grows_linearly_on_a_constant_gradient():
    # FACTS 1: .grad is a running sum; with the same gradient k times, the norm is k times one.
    model = mlp("cpu", torch.float64)
    x = torch.randn(5, 4, dtype=torch.float64)
    norms = []
    for _ in range(5):
        model(x).pow(2).mean().backward()
        norms.append(grad_norm(model))
    for k, norm in enumerate(norms, start=1):
        assert norm == pytest.approx(k * norms[0], rel=1e-12)


def test_graph_leaks_counts_tensors_with_a_grad_fn():
    model = mlp("cpu")
    x = torch.randn(5, 4)

    def loss():
        return model(x).sum()

    with torch.no_grad():
        detached_scores = model(x)
    log = {
        "losses": [loss(), loss().detach(), loss().item(), "epoch 1", None],
        "nested": ([[loss()]], {"inner": loss()}),
        "leaves": [model[0].weight, x, torch.zeros(2, requires_grad=True), detached_scores],
        "argmax": model(x).argmax(dim=1),
    }
    assert graph_leaks(log) == 3
    assert graph_leaks(loss()) == 1
    assert graph_leaks(0.5) == 0
    assert graph_leaks({}) == 0


def test_graph_leaks_does_not_recurse_into_strings_or_keys():
    loss = mlp("cpu")(torch.randn(2, 4)).sum()
    assert graph_leaks(["abc", {"a": "b"}]) == 0
    assert graph_leaks({loss: "value"}) == 0  # keys are not searched
    assert graph_leaks([loss, loss]) == 2  # each place that holds one counts


def test_nonfinite_grads_names_the_poisoned_parameters():
    model = mlp("cpu")
    backward(model, "cpu")
    assert nonfinite_grads(model) == []
    model[2].bias.grad[0] = float("nan")
    model[0].weight.grad[1, 1] = float("inf")
    assert nonfinite_grads(model) == ["0.weight", "2.bias"]


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_activation_watch_counts_what_the_graph_keeps(device):
    # Linear(4→3), ReLU, Linear(3→2) on a batch of 5. While `out` is held: the ReLU output
    # (5×3, saved by ReLU and by the second Linear) and `out` itself (5×2). The first Linear's
    # output is saved by nobody (ReLU saves its result, not its input) and is freed at once.
    model = mlp(device)
    x = torch.randn(5, 4, device=device)
    with ActivationWatch(model) as watch:
        out = model(x)
        assert (watch.live_graphs(), watch.live_bytes()) == (1, (15 + 10) * F32)
        loss = out.sum()
        del out
        assert (watch.live_graphs(), watch.live_bytes()) == (1, 15 * F32)
        loss.backward()  # frees what the graph saved; `loss` keeps the nodes
        assert (watch.live_graphs(), watch.live_bytes()) == (1, 0)
        del loss
        assert (watch.live_graphs(), watch.live_bytes()) == (0, 0)


def test_activation_watch_sees_kept_graphs_and_no_grad():
    model = mlp("cpu")
    x = torch.randn(5, 4)
    with ActivationWatch(model) as watch:
        kept = [model(x).sum() for _ in range(3)]
        assert watch.live_graphs() == 3
        assert watch.live_bytes() == 3 * 15 * F32
        for loss in kept:
            loss.backward(retain_graph=True)
        assert watch.live_bytes() == 3 * 15 * F32  # retain_graph keeps the saved tensors
        with torch.no_grad():
            model(x)
        assert watch.live_graphs() == 3
        del kept, loss
        assert (watch.live_graphs(), watch.live_bytes()) == (0, 0)


def test_activation_watch_removes_its_hooks_and_keeps_nothing_alive():
    model = mlp("cpu")
    watch = ActivationWatch(model)
    watch.close()
    out = model(torch.randn(5, 4))
    assert (watch.live_graphs(), watch.live_bytes()) == (0, 0)
    assert not model._forward_hooks and not model[0]._forward_hooks
    del out
